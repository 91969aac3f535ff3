//! TLS to Postgres as libpq's settings say, against real servers: one started with `ssl=on` and a
//! certificate from a CA the test makes, and the shared cluster, which has no TLS.

use std::time::Duration;

use tokio_postgres::Client;
use txoutbox::{
    pg::{PgConfig, SslMode},
    OutboxMessage,
};
use txoutbox_test_support::relay::{RecordingSink, RunningRelay};
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::select::value;
use txoutbox_test_support::tls::{self_signed_cert, TestCa, TlsServer};
use txoutbox_test_support::{eventually_async, Cluster, ConnInfo, TestDb};

type TestResult = anyhow::Result<()>;

/// Whether the session of `client` is encrypted, as the server sees it.
async fn encrypted(client: &Client) -> anyhow::Result<bool> {
    Ok(client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?
        .get(0))
}

/// Connects with `pg`, driving the connection on a task.
async fn connect(pg: &PgConfig) -> txoutbox::Result<Client> {
    let (client, connection) = pg.connect().await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The message a connection with `pg` fails with (the test fails if it connects).
async fn failure(pg: &PgConfig) -> String {
    match pg.connect().await {
        Ok(_) => panic!("connected with {pg:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_one_line(message: &str) {
    assert_eq!(message.lines().count(), 1, "{message}");
}

/// Fails unless `message` is one line that contains `part`.
fn assert_one_line_saying(message: &str, part: &str) {
    assert_one_line(message);
    assert!(message.contains(part), "{message}");
}

/// Connects with `info` and tells whether the session is encrypted.
async fn connects_encrypted(info: &ConnInfo) -> anyhow::Result<bool> {
    encrypted(&connect(&info.config()?).await?).await
}

/// A CA other than `server`'s, its certificate written beside the server's files.
fn other_ca(server: &TlsServer) -> anyhow::Result<std::path::PathBuf> {
    let stranger = TestCa::new("another CA")?;
    server.write_file("other-ca.pem", &stranger.cert_pem())
}

/// The shared cluster (no TLS), as the superuser.
fn plain_server() -> anyhow::Result<ConnInfo> {
    let cluster = Cluster::shared()?;
    let admin = cluster.admin();
    // The shared cluster outlives the test process on purpose.
    std::mem::forget(cluster);
    Ok(admin)
}

#[tokio::test]
async fn verify_full_with_the_right_ca_and_host_name_carries_the_relay_over_tls() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let db = TestDb::create_on(&server.verified()).await?;
    assert_eq!(db.config()?.ssl_mode(), SslMode::VerifyFull);
    let mut client = db.connect().await?;
    assert!(encrypted(&client).await?);

    enqueue_committed(
        &mut client,
        &[
            OutboxMessage::new("email", &serde_json::json!({ "to": "a" }))?
                .with_downstream_key("over-tls"),
        ],
    )
    .await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("email", sink.clone()).build()?);
    assert_eq!(sink.wait_for(1, Duration::from_secs(20)).await, 1);

    // Every connection of the relay (its pool and its LISTEN) is encrypted.
    let sessions = "SELECT count(*) FILTER (WHERE a.query = 'LISTEN txoutbox_wake'), \
                           count(*) FILTER (WHERE NOT s.ssl), count(*) \
                    FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                    WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()";
    let read = || async {
        let row = client.query_one(sessions, &[]).await?;
        anyhow::Ok::<(i64, i64, i64)>((row.get(0), row.get(1), row.get(2)))
    };
    eventually_async("the relay's LISTEN session is up", || async {
        Ok(read().await?.0 > 0)
    })
    .await?;
    let (listeners, plain, total) = read().await?;
    relay.stop().await?;
    assert_eq!(listeners, 1, "the relay's LISTEN connection");
    assert!(total >= 2, "{total} sessions of the relay");
    assert_eq!(plain, 0, "plain sessions among {total}");
    Ok(())
}

#[tokio::test]
async fn verify_full_with_another_ca_fails_in_one_line_naming_sslrootcert() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let other_ca = other_ca(&server)?;
    let info = server
        .verified()
        .with_tls("sslrootcert", &other_ca.display().to_string());
    let message = failure(&info.config()?).await;
    assert_one_line_saying(
        &message,
        &format!(
            "TLS: the server's certificate is not signed by the CA in {} (sslrootcert)",
            other_ca.display()
        ),
    );
    Ok(())
}

#[tokio::test]
async fn verify_full_with_a_certificate_for_another_host_fails_in_one_line_naming_both(
) -> TestResult {
    let server = TlsServer::start(&["db.example"])?;
    let message = failure(&server.verified().config()?).await;
    assert_one_line_saying(
        &message,
        "TLS: the server's certificate is not issued for \"localhost\" but for db.example",
    );
    assert!(message.contains("sslmode=verify-full"), "{message}");
    Ok(())
}

#[tokio::test]
async fn verify_ca_checks_the_chain_but_not_the_host_name() -> TestResult {
    let server = TlsServer::start(&["db.example"])?;
    let chain_only = server.verified().with_tls("sslmode", "verify-ca");
    assert!(connects_encrypted(&chain_only).await?);

    let other_ca = other_ca(&server)?;
    let wrong_chain = chain_only.with_tls("sslrootcert", &other_ca.display().to_string());
    let message = failure(&wrong_chain.config()?).await;
    assert_one_line_saying(&message, "is not signed by the CA in");
    Ok(())
}

#[tokio::test]
async fn verify_full_accepts_a_self_signed_certificate_that_is_its_own_sslrootcert() -> TestResult {
    // CA:TRUE and the name in the common name only, as `openssl req -x509 -subj /CN=localhost`.
    let server = TlsServer::start_self_signed(self_signed_cert("localhost", false)?)?;
    assert!(connects_encrypted(&server.verified()).await?);
    Ok(())
}

#[tokio::test]
async fn verify_ca_accepts_a_self_signed_certificate_that_is_its_own_sslrootcert_for_any_host(
) -> TestResult {
    let server = TlsServer::start_self_signed(self_signed_cert("db.example", false)?)?;
    let chain_only = server.verified().with_tls("sslmode", "verify-ca");
    assert!(connects_encrypted(&chain_only).await?);
    Ok(())
}

#[tokio::test]
async fn verify_full_refuses_a_self_signed_certificate_for_another_host_in_one_line_naming_both(
) -> TestResult {
    let server = TlsServer::start_self_signed(self_signed_cert("db.example", false)?)?;
    let message = failure(&server.verified().config()?).await;
    assert_one_line_saying(
        &message,
        "TLS: the server's certificate is not issued for \"localhost\" but for db.example",
    );
    Ok(())
}

#[tokio::test]
async fn a_self_signed_certificate_other_than_sslrootcerts_is_refused_in_one_line() -> TestResult {
    let server = TlsServer::start_self_signed(self_signed_cert("localhost", false)?)?;
    let stranger = self_signed_cert("localhost", false)?;
    let other = server.write_file("other.pem", &stranger.cert_pem)?;
    for mode in ["verify-ca", "verify-full"] {
        let info = server
            .verified()
            .with_tls("sslmode", mode)
            .with_tls("sslrootcert", &other.display().to_string());
        let message = failure(&info.config()?).await;
        assert_one_line_saying(
            &message,
            &format!(
                "TLS: the server's certificate is a CA certificate (CA:TRUE) that is not itself \
                 in the CA in {} (sslrootcert)",
                other.display()
            ),
        );
    }
    Ok(())
}

#[tokio::test]
async fn an_expired_self_signed_certificate_in_sslrootcert_is_refused_in_one_line() -> TestResult {
    let server = TlsServer::start_self_signed(self_signed_cert("localhost", true)?)?;
    let message = failure(&server.verified().config()?).await;
    assert_one_line_saying(&message, "TLS: the server's certificate has expired");
    Ok(())
}

#[tokio::test]
async fn require_refuses_a_server_without_tls_in_one_line() -> TestResult {
    let info = plain_server()?.with_tls("sslmode", "require");
    let message = failure(&info.config()?).await;
    assert_one_line_saying(&message, "TLS: the server does not accept TLS connections");
    assert!(message.contains("require"), "{message}");
    Ok(())
}

#[tokio::test]
async fn verify_full_refuses_a_server_without_tls_in_one_line() -> TestResult {
    let ca = TestCa::new("txoutbox test CA")?;
    let dir = tempfile::tempdir()?;
    let ca_file = ca.write_cert(dir.path(), "ca.pem")?;
    let info = plain_server()?
        .with_host("localhost")
        .with_tls("sslmode", "verify-full")
        .with_tls("sslrootcert", &ca_file.display().to_string());
    let message = failure(&info.config()?).await;
    assert_one_line_saying(&message, "TLS: the server does not accept TLS connections");
    Ok(())
}

#[tokio::test]
async fn require_without_a_ca_encrypts_without_checking_the_certificate() -> TestResult {
    let server = TlsServer::start(&["db.example"])?;
    assert!(connects_encrypted(&server.admin().with_tls("sslmode", "require")).await?);
    Ok(())
}

#[tokio::test]
async fn prefer_is_the_default_and_uses_tls_when_the_server_offers_it() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let tls = PgConfig::parse_with_env(&server.admin().url(), |_| None)?;
    assert_eq!(tls.ssl_mode(), SslMode::Prefer);
    assert!(encrypted(&connect(&tls).await?).await?);

    let plain = PgConfig::parse_with_env(&plain_server()?.url(), |_| None)?;
    assert_eq!(plain.ssl_mode(), SslMode::Prefer);
    assert!(!encrypted(&connect(&plain).await?).await?);
    Ok(())
}

#[tokio::test]
async fn disable_stays_plain_where_prefer_encrypts() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let prefer = server.admin().with_tls("sslmode", "prefer");
    let disable = server.admin().with_tls("sslmode", "disable");
    assert!(connects_encrypted(&prefer).await?);
    assert!(!connects_encrypted(&disable).await?);
    Ok(())
}

#[tokio::test]
async fn url_key_value_and_environment_forms_connect_alike() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let port = server.cluster.port();
    let ca = server.ca_file().display().to_string();
    let other_ca = other_ca(&server)?;
    let other = other_ca.display().to_string();
    let escaped = |path: &str| path.replace('/', "%2F");
    let forms = |ca: &str| -> anyhow::Result<Vec<PgConfig>> {
        let ca_env = ca.to_owned();
        Ok(vec![
            PgConfig::parse_with_env(
                &format!(
                    "postgres://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={}",
                    escaped(ca)
                ),
                |_| None,
            )?,
            PgConfig::parse_with_env(
                &format!(
                    "host=localhost port={port} user=postgres dbname=postgres \
                     sslmode=verify-full sslrootcert='{ca}'"
                ),
                |_| None,
            )?,
            PgConfig::parse_with_env(
                &format!("host=localhost port={port} user=postgres dbname=postgres"),
                move |name| match name {
                    "PGSSLMODE" => Some("verify-full".into()),
                    "PGSSLROOTCERT" => Some(ca_env.clone()),
                    _ => None,
                },
            )?,
        ])
    };
    for pg in forms(&ca)? {
        assert_eq!(pg.ssl_mode(), SslMode::VerifyFull);
        assert_eq!(pg.root_cert(), Some(server.ca_file()));
        assert!(encrypted(&connect(&pg).await?).await?, "{pg:?}");
    }
    let mut messages = Vec::new();
    for pg in forms(&other)? {
        messages.push(failure(&pg).await);
    }
    assert!(
        messages[0].contains("is not signed by the CA in"),
        "{messages:?}"
    );
    assert!(messages.iter().all(|m| *m == messages[0]), "{messages:?}");
    Ok(())
}

#[tokio::test]
async fn sslcert_and_sslkey_present_a_client_certificate() -> TestResult {
    let server = TlsServer::start_requiring_client_certs(&["localhost"])?;
    let client = server.ca.client_cert("postgres")?;
    let cert = server.write_file("client.crt", &client.cert_pem)?;
    let key = server.write_file("client.key", &client.key_pem)?;
    let info = server
        .verified()
        .with_tls("sslcert", &cert.display().to_string())
        .with_tls("sslkey", &key.display().to_string());
    let pg = info.config()?;
    assert_eq!(pg.client_cert(), Some((cert.as_path(), key.as_path())));
    let session = connect(&pg).await?;
    let subject: Option<String> = value(
        &session,
        "SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .await?;
    assert_eq!(subject.as_deref(), Some("/CN=postgres"));

    let message = failure(&server.verified().config()?).await;
    assert_one_line_saying(&message, "connection requires a valid client certificate");
    Ok(())
}
