//! The connection-string parser and the TLS error text, without a server.

use tokio_postgres::config::{Host, SslMode as TheirSslMode};

use rustls::pki_types::ServerName;

use super::tls::bare_name;
use super::verify::{wildcard_matches, CertNames};
use super::*;

fn parse(text: &str) -> Result<PgConfig> {
    PgConfig::parse_with_env(text, |_| None)
}

/// The message of the `Error::Config` that parsing `text` fails with.
fn config_error(text: &str) -> String {
    match parse(text) {
        Err(Error::Config(message)) => message,
        other => panic!("{text}: expected Error::Config, got {other:?}"),
    }
}

/// Asserts the sslmode txoutbox reads (`ours`) and the one tokio-postgres's config holds.
fn assert_ssl_modes(pg: &PgConfig, ours: SslMode, theirs: TheirSslMode) {
    assert_eq!(pg.ssl_mode(), ours);
    assert_eq!(pg.config().get_ssl_mode(), theirs);
}

#[test]
fn url_keeps_tls_parameters_tokio_postgres_refuses() -> Result<()> {
    let pg = parse("postgres://app:pw@db.example:6543/shop?sslmode=require&application_name=x")?;
    assert_ssl_modes(&pg, SslMode::Require, TheirSslMode::Require);
    assert_eq!(pg.config().get_dbname(), Some("shop"));
    assert_eq!(pg.config().get_application_name(), Some("x"));
    Ok(())
}

#[test]
fn key_value_form_with_quotes_survives_stripping() -> Result<()> {
    let pg = parse(r"host=localhost user=app password='it\'s x' sslmode = disable dbname=a\ b")?;
    assert_eq!(pg.ssl_mode(), SslMode::Disable);
    assert_eq!(pg.config().get_password(), Some(&b"it's x"[..]));
    assert_eq!(pg.config().get_dbname(), Some("a b"));
    Ok(())
}

/// As libpq: `prefer` without an sslmode, and a Unix socket ignores the sslmode (txoutbox keeps
/// what it was told; tokio-postgres is told to disable TLS there).
#[test]
fn the_default_is_prefer_and_unix_sockets_ignore_sslmode_as_libpq_does() -> Result<()> {
    for (case, text, ours, theirs) in [
        (
            "the default",
            "host=localhost",
            SslMode::Prefer,
            TheirSslMode::Prefer,
        ),
        (
            "a Unix socket",
            "host=/var/run/postgresql sslmode=require",
            SslMode::Require,
            TheirSslMode::Disable,
        ),
    ] {
        let pg = parse(text)?;
        assert_eq!(pg.ssl_mode(), ours, "{case}");
        assert_eq!(pg.config().get_ssl_mode(), theirs, "{case}");
    }
    Ok(())
}

#[test]
fn unknown_sslmode_is_a_config_error_naming_sslmode() {
    let message = config_error("host=x sslmode=allow");
    assert!(
        message.starts_with("sslmode: \"allow\" is not one of"),
        "{message}"
    );
    let message = config_error("postgres://x/db?sslmode=verify_full");
    assert!(message.starts_with("sslmode: \"verify_full\""), "{message}");
}

#[test]
fn verify_full_without_a_ca_is_a_config_error_naming_sslrootcert() {
    for text in [
        "host=localhost sslmode=verify-full",
        "postgres://localhost/db?sslmode=verify-ca",
    ] {
        let message = config_error(text);
        assert!(
            message.starts_with("sslrootcert: sslmode=verify-"),
            "{message}"
        );
    }
}

#[test]
fn sslcert_without_sslkey_and_the_reverse_are_config_errors() {
    let message = config_error("host=x sslcert=/etc/client.pem");
    assert!(message.starts_with("sslkey: sslcert is set"), "{message}");
    let message = config_error("host=x sslkey=/etc/client.key");
    assert!(message.starts_with("sslcert: sslkey is set"), "{message}");
}

#[test]
fn missing_files_are_config_errors_naming_the_setting_and_the_path() {
    let message =
        config_error("postgres://localhost/db?sslmode=verify-ca&sslrootcert=%2Fnowhere%2Fca.pem");
    assert!(
        message.starts_with("sslrootcert: cannot read /nowhere/ca.pem"),
        "{message}"
    );
    let message = config_error("host=x sslcert=/nowhere/c.pem sslkey=/nowhere/c.key");
    assert!(
        message.starts_with("sslcert: cannot read /nowhere/c.pem"),
        "{message}"
    );
}

#[test]
fn a_ca_file_without_a_certificate_is_a_config_error() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, "not a certificate\n")?;
    let message = config_error(&format!(
        "host=x sslmode=verify-full sslrootcert='{}'",
        path.display()
    ));
    assert_eq!(
        message,
        format!("sslrootcert: {} holds no PEM certificate", path.display())
    );
    Ok(())
}

#[test]
fn unsupported_tls_settings_are_refused_by_name() {
    for (text, setting) in [
        ("host=x sslcrl=/x", "sslcrl"),
        ("host=x sslpassword=p", "sslpassword"),
        (
            "postgres://x/db?ssl_min_protocol_version=TLSv1.3",
            "ssl_min_protocol_version",
        ),
    ] {
        let message = config_error(text);
        assert!(
            message.starts_with(&format!("{setting}: not supported")),
            "{message}"
        );
    }
    let message = config_error("host=x sslmode=verify-full sslrootcert=system");
    assert!(message.starts_with("sslrootcert: \"system\""), "{message}");
}

#[test]
fn malformed_strings_are_config_errors() {
    assert!(config_error("host=x user='open").contains("unterminated"));
    assert!(config_error("host x").contains("expected ="));
    assert!(config_error("postgres://x/db?sslrootcert=%zz").contains("percent-escape"));
    assert_eq!(
        config_error("postgres://x/db?bogus=1"),
        "connection string: invalid connection string: unknown option `bogus`"
    );
}

#[test]
fn a_url_of_another_scheme_is_refused_by_its_scheme_without_the_password() {
    for (text, scheme) in [
        ("postgress://app:s3cret@db/app", "postgress"),
        ("mysql://app:s3cret@db/app", "mysql"),
        ("Postgres+ssl://app:s3cret@db/app", "Postgres+ssl"),
    ] {
        let message = config_error(text);
        assert_eq!(
            message,
            format!(
                "connection string: unknown scheme `{scheme}` (expected postgres:// or \
                 postgresql://, or key=value pairs)"
            )
        );
        assert!(!message.contains("s3cret"), "{message}");
    }
    // A key=value value that holds "://" is no scheme.
    assert!(parse("host=db options='-c search_path=a://b'").is_ok());
}

#[test]
fn the_target_names_every_host_and_port_and_never_the_password() -> Result<()> {
    let pg = parse("postgres://app:s3cret@db1:5433,[::1]:5434/app")?;
    assert_eq!(pg.target(), "db1:5433, [::1]:5434");
    let pg = parse("host=/run/postgresql user=app password=s3cret")?;
    assert_eq!(pg.target(), "/run/postgresql/.s.PGSQL.5432");
    let pg = parse("host=db1,db2 port=6432 password=s3cret")?;
    assert_eq!(pg.target(), "db1:6432, db2:6432");
    Ok(())
}

#[tokio::test]
async fn a_refused_connection_names_the_host_and_port_tried_and_not_the_password() {
    // A port nothing listens on: connecting is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let pg = parse(&format!("postgres://app:s3cret@127.0.0.1:{port}/app")).expect("parses");
    let err = pg.connect().await.err().expect("refused");
    let text = err.to_string();
    assert!(err.is_unavailable(), "{text}");
    assert!(
        text.contains(&format!("cannot connect to 127.0.0.1:{port}: ")),
        "{text}"
    );
    assert!(!text.contains("error connecting to server"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

#[test]
fn environment_fills_what_the_string_leaves_out() -> Result<()> {
    let pg = PgConfig::parse_with_env("dbname=x", |name| match name {
        "PGHOST" => Some("db1".into()),
        "PGUSER" => Some("u".into()),
        "PGSSLMODE" => Some("require".into()),
        "PGDATABASE" => Some("ignored".into()),
        _ => None,
    })?;
    assert_eq!(pg.ssl_mode(), SslMode::Require);
    assert_eq!(pg.config().get_user(), Some("u"));
    assert_eq!(pg.config().get_dbname(), Some("x"));
    assert!(matches!(pg.config().get_hosts(), [Host::Tcp(h)] if h == "db1"));
    Ok(())
}

#[test]
fn the_string_wins_over_the_environment() -> Result<()> {
    let pg = PgConfig::parse_with_env("host=a sslmode=disable", |name| match name {
        "PGSSLMODE" => Some("verify-full".into()),
        "PGHOST" => Some("b".into()),
        _ => None,
    })?;
    assert_eq!(pg.ssl_mode(), SslMode::Disable);
    assert!(matches!(pg.config().get_hosts(), [Host::Tcp(h)] if h == "a"));
    Ok(())
}

#[test]
fn an_unknown_sslmode_in_the_environment_names_sslmode() {
    let err = PgConfig::parse_with_env("host=x", |name| {
        (name == "PGSSLMODE").then(|| "on".to_owned())
    });
    assert!(
        matches!(&err, Err(Error::Config(m)) if m.starts_with("sslmode: \"on\"")),
        "{err:?}"
    );
}

#[test]
fn a_hostaddr_without_host_names_the_server_for_tls() -> Result<()> {
    let pg = parse("hostaddr=127.0.0.1 sslmode=require")?;
    assert!(matches!(pg.config().get_hosts(), [Host::Tcp(h)] if h == "127.0.0.1"));
    Ok(())
}

#[test]
fn sslnegotiation_is_passed_to_tokio_postgres() -> Result<()> {
    let pg = parse("host=x sslmode=require sslnegotiation=direct")?;
    assert_eq!(
        pg.config().get_ssl_negotiation(),
        tokio_postgres::config::SslNegotiation::Direct
    );
    Ok(())
}

#[test]
fn a_tokio_postgres_config_keeps_its_sslmode() {
    let mut config = Config::new();
    config
        .host("x")
        .ssl_mode(tokio_postgres::config::SslMode::Require);
    assert_eq!(PgConfig::from(config).ssl_mode(), SslMode::Require);
    assert_eq!(PgConfig::from(Config::new()).ssl_mode(), SslMode::Prefer);
}

#[test]
fn presented_names_are_shown_bare() {
    assert_eq!(bare_name("DnsName(\"db.example\")"), "db.example");
    assert_eq!(bare_name("IpAddress(10.0.0.1)"), "10.0.0.1");
    assert_eq!(bare_name("something else"), "something else");
}

/// The names of a certificate: DNS names and IP addresses of its subjectAltName, its CN.
fn names(dns: &[&str], ips: &[&[u8]], common_name: Option<&str>) -> CertNames {
    CertNames {
        dns: dns.iter().map(|n| n.as_bytes().to_vec()).collect(),
        ips: ips.iter().map(|ip| ip.to_vec()).collect(),
        common_name: common_name.map(|cn| cn.as_bytes().to_vec()),
    }
}

fn host(name: &str) -> ServerName<'static> {
    ServerName::try_from(name.to_owned()).expect("a valid server name")
}

#[test]
fn a_wildcard_stands_for_one_whole_leftmost_label_as_in_libpq() {
    assert!(wildcard_matches(b"*.example.com", "db.example.com"));
    assert!(wildcard_matches(b"*.EXAMPLE.com", "DB.example.COM"));
    assert!(!wildcard_matches(b"*.example.com", "a.db.example.com"));
    assert!(!wildcard_matches(b"*.example.com", "example.com"));
    assert!(!wildcard_matches(b"*.example.com", ".example.com"));
    assert!(!wildcard_matches(b"db*.example.com", "db1.example.com"));
    assert!(!wildcard_matches(b"*.", "a."));
    assert!(!wildcard_matches(b"*", "anything"));
}

#[test]
fn the_common_name_counts_only_without_a_san_name_of_the_hosts_kind() {
    let cn_only = names(&[], &[], Some("localhost"));
    assert!(cn_only.match_host(&host("localhost")));
    assert!(cn_only.match_host(&host("LOCALHOST")));
    assert!(!cn_only.match_host(&host("db.example")));

    let with_san = names(&["db.example"], &[], Some("localhost"));
    assert!(with_san.match_host(&host("db.example")));
    assert!(
        !with_san.match_host(&host("localhost")),
        "a DNS name hides the CN"
    );

    // For an address, only IP addresses of the SAN hide the CN.
    let dns_and_cn = names(&["db.example"], &[], Some("127.0.0.1"));
    assert!(dns_and_cn.match_host(&host("127.0.0.1")));
    let ip_and_cn = names(&[], &[&[10, 0, 0, 1]], Some("127.0.0.1"));
    assert!(!ip_and_cn.match_host(&host("127.0.0.1")));
    assert!(ip_and_cn.match_host(&host("10.0.0.1")));
}

#[test]
fn a_wildcard_common_name_matches_as_a_san_name_does() {
    let wildcard = names(&[], &[], Some("*.example.com"));
    assert!(wildcard.match_host(&host("db.example.com")));
    assert!(!wildcard.match_host(&host("a.db.example.com")));
}

/// A pool from `pool_builder` gives up on a server that takes the connection and never answers,
/// at its create timeout, instead of holding the caller until the operating system does.
#[tokio::test]
async fn a_pool_gives_up_on_a_server_that_never_answers() -> Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::Config(e.to_string()))?
        .port();
    let silent = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let pg = parse(&format!(
        "postgres://root@127.0.0.1:{port}/x?sslmode=disable"
    ))?;
    let pool = pg
        .pool_builder(1)
        .build()
        .map_err(|e| Error::Config(e.to_string()))?;
    let got = tokio::time::timeout(POOL_CREATE_TIMEOUT * 4, pool.get()).await;
    silent.abort();
    assert!(
        matches!(
            got,
            Ok(Err(deadpool_postgres::PoolError::Timeout(
                deadpool_postgres::TimeoutType::Create
            )))
        ),
        "expected the pool's create timeout, got {got:?}"
    );
    Ok(())
}
