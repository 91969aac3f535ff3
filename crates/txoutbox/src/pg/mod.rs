//! Connections to Postgres, with TLS as libpq does it: one parser for the connection string
//! (URL or key=value form, and the `PG*` environment variables) that keeps the TLS settings
//! tokio-postgres does not know (`sslrootcert`, `sslcert`, `sslkey`, `verify-ca`, `verify-full`),
//! and one rustls connector that honours them. Every connection the library, the relay and the
//! binaries open goes through [`PgConfig`].
//!
//! Layout: this file holds [`PgConfig`] and its public API, and the one-line text of a failed
//! connection; `connection` drives connections (notices logged by severity, the pool's
//! connector) and names the hosts and ports of a failed one; `parse` reads the connection string (libpq's URL and key=value forms, the `PG*`
//! variables); `tls` holds [`SslMode`] and the rustls connector ([`MakeTls`]); `verify` the
//! certificate checks of each mode (a self-signed certificate in `sslrootcert` accepted as libpq
//! accepts it, host names matched by libpq's rules).

use std::fmt;
use std::path::{Path, PathBuf};

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};

mod connection;
mod parse;
#[cfg(test)]
mod tests;
mod tls;
mod verify;

pub use connection::{drive, log_notice};
use parse::{apply_env, strip_tls_params, TlsParams};
use tls::{client_config, Verify};
pub use tls::{MakeTls, SslMode, TlsConnector, TlsError};

/// The stream of a connection opened through [`PgConfig`] (TLS or plain, as negotiated).
pub type PgStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// A connection to drive (spawn it), as [`tokio_postgres::connect`] returns.
pub type PgConnection = Connection<Socket, PgStream>;

/// Where and how to connect: a `tokio_postgres::Config` and the TLS settings of libpq.
///
/// ```no_run
/// # async fn demo() -> Result<(), txoutbox::Error> {
/// let pg = txoutbox::pg::PgConfig::parse(
///     "postgres://app@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
/// )?;
/// let (client, connection) = pg.connect().await?;
/// tokio::spawn(txoutbox::pg::drive(connection));
/// let relay = txoutbox::relay::Relay::builder(pg.clone()); // any API taking a config takes it
/// # let _ = (client, relay); Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgConfig {
    config: Config,
    mode: SslMode,
    root_cert: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    tls: MakeTls,
}

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("config", &self.config)
            .field("sslmode", &self.mode)
            .field("sslrootcert", &self.root_cert)
            .finish_non_exhaustive()
    }
}

impl PgConfig {
    /// Parses a connection string as libpq does: a `postgres://` (or `postgresql://`) URL or a
    /// `key=value` list, with the `PG*` environment variables (`PGHOST`, `PGPORT`, `PGUSER`,
    /// `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`) for
    /// what the string leaves out. Certificates and keys are read here, so a missing or
    /// unreadable file is an [`Error::Config`] naming the setting, before any connection.
    pub fn parse(text: &str) -> Result<PgConfig> {
        Self::parse_with_env(text, |name| std::env::var(name).ok())
    }

    /// [`PgConfig::parse`] with the environment given by `env` (a variable's value by name).
    pub fn parse_with_env(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<PgConfig> {
        let mut tls = TlsParams::default();
        let rest = strip_tls_params(text.trim(), &mut tls)?;
        let mut config: Config = rest
            .parse()
            .map_err(|e| Error::Config(format!("connection string: {}", with_causes(&e))))?;
        apply_env(&mut config, &mut tls, &env)?;
        let mode = match &tls.mode {
            Some(mode) => SslMode::parse(mode)?,
            None => SslMode::default(),
        };
        // libpq's default files, in ~/.postgresql.
        let home = env("HOME").map(|h| Path::new(&h).join(".postgresql"));
        let default = |file: &str| home.as_ref().map(|dir| dir.join(file));
        let root_cert = match tls.root_cert.as_deref() {
            Some("system") => {
                return Err(Error::Config(
                    "sslrootcert: \"system\" is not supported; give the CA's PEM file".into(),
                ))
            }
            Some(path) => Some(PathBuf::from(path)),
            None => default("root.crt").filter(|p| p.is_file()),
        };
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
            return Err(Error::Config(format!(
                "sslrootcert: sslmode={mode} checks the server's certificate against a CA: \
                 set sslrootcert to the CA's PEM file (there is no ~/.postgresql/root.crt)"
            )));
        }
        let cert = match tls.cert {
            Some(path) => Some(PathBuf::from(path)),
            None => default("postgresql.crt").filter(|p| p.is_file()),
        };
        let key = match tls.key {
            Some(path) => Some(PathBuf::from(path)),
            None => default("postgresql.key").filter(|p| p.is_file() && cert.is_some()),
        };
        // Without a CA, `require` and `prefer` encrypt without checking (libpq's behaviour).
        let verify = match (mode, &root_cert) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => Verify::None,
            (SslMode::Require, Some(_)) | (SslMode::VerifyCa, _) => Verify::Chain,
            (SslMode::VerifyFull, _) => Verify::Full,
        };
        let client_auth = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            (Some(_), None) => {
                return Err(Error::Config(
                    "sslkey: sslcert is set, but not the key of the certificate".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(Error::Config(
                    "sslcert: sslkey is set, but not the certificate".into(),
                ))
            }
        };
        let root = match verify {
            Verify::None => None,
            _ => root_cert.as_deref(),
        };
        let tls_config = client_config(verify, root, client_auth.as_ref())?;
        // libpq checks the certificate of a `hostaddr` given without `host` against the
        // address; tokio-postgres names the server for TLS by `host` only.
        if config.get_hosts().is_empty() {
            for addr in config.get_hostaddrs().to_vec() {
                config.host(addr.to_string());
            }
        }
        // Postgres has no TLS over Unix sockets, and libpq ignores sslmode there.
        let unix_only = !config.get_hosts().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_)));
        config.ssl_mode(match mode {
            _ if unix_only => tokio_postgres::config::SslMode::Disable,
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        Ok(PgConfig {
            config,
            mode,
            tls: MakeTls::new(tls_config, mode, root.map(Path::to_path_buf)),
            root_cert,
            client_cert: client_auth,
        })
    }

    /// The tokio-postgres configuration (host, user, options...); its TLS settings are this
    /// config's.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The tokio-postgres configuration, to change a setting (`options`, `dbname`...).
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// The `sslmode` in effect.
    pub fn ssl_mode(&self) -> SslMode {
        self.mode
    }

    /// The CA file the server's certificate is checked against, if any.
    pub fn root_cert(&self) -> Option<&Path> {
        self.root_cert.as_deref()
    }

    /// The client certificate and its key (`sslcert`, `sslkey`) presented to the server, if any.
    pub fn client_cert(&self) -> Option<(&Path, &Path)> {
        self.client_cert
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()))
    }

    /// The TLS connector, for `tokio_postgres::Config::connect` and pools of one's own.
    pub fn tls(&self) -> MakeTls {
        self.tls.clone()
    }

    /// Opens a connection; drive the returned [`PgConnection`] on a task of its own
    /// ([`drive`]). A server that cannot be reached (or a TLS failure) is
    /// [`Error::StoreUnavailable`] with one line naming the hosts and ports tried and what was
    /// wrong (never the password).
    pub async fn connect(&self) -> Result<(Client, PgConnection)> {
        self.config
            .connect(self.tls())
            .await
            .map_err(|e| connection::connect_error(&self.target(), e))
    }

    /// Where this configuration connects, for messages: `host:port` of each host, comma-separated
    /// (a Unix socket as its path), without the user or the password.
    pub fn target(&self) -> String {
        connection::target(&self.config)
    }

    /// A deadpool manager over this configuration, with TLS; its connections are driven by
    /// [`drive`] (notices logged by severity).
    pub fn manager(&self, config: deadpool_postgres::ManagerConfig) -> deadpool_postgres::Manager {
        deadpool_postgres::Manager::from_connect(
            self.config.clone(),
            connection::Connector { tls: self.tls() },
            config,
        )
    }

    /// A pool of at most `size` connections over this configuration, to finish with
    /// `.build()`: connections recycled without a round trip (`RecyclingMethod::Fast`; a broken
    /// one is dropped when its next statement fails) and every wait bounded, so an unreachable
    /// or saturated Postgres fails a request in seconds instead of holding it: 5 s to open a
    /// connection, 5 s to wait for a free one, 2 s to recycle one. Any of them can be changed on
    /// the builder.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pg = txoutbox::pg::PgConfig::parse("postgres://app@db.internal/app")?;
    /// let pool = pg.pool_builder(16).build()?;
    /// # let _ = pool; Ok(()) }
    /// ```
    pub fn pool_builder(&self, size: usize) -> deadpool_postgres::PoolBuilder {
        let manager = self.manager(deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        });
        deadpool_postgres::Pool::builder(manager)
            .max_size(size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(POOL_CREATE_TIMEOUT))
            .wait_timeout(Some(POOL_WAIT_TIMEOUT))
            .recycle_timeout(Some(POOL_RECYCLE_TIMEOUT))
    }
}

/// How long [`PgConfig::pool_builder`]'s pools wait to open a connection.
pub const POOL_CREATE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long [`PgConfig::pool_builder`]'s pools wait for a free connection.
pub const POOL_WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long [`PgConfig::pool_builder`]'s pools wait to recycle a connection.
pub const POOL_RECYCLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl std::str::FromStr for PgConfig {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        PgConfig::parse(text)
    }
}

/// A `tokio_postgres::Config` has no place for certificates: its `sslmode` (disable, prefer,
/// require) is used as is, without checking the server's certificate. Parse the connection
/// string with [`PgConfig::parse`] to check it (`verify-ca`, `verify-full`).
impl From<Config> for PgConfig {
    fn from(config: Config) -> Self {
        let mode = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        // Without files to read, building the rustls config cannot fail (ring has TLS 1.2 and 1.3).
        let tls = client_config(Verify::None, None, None).expect("a TLS config without files");
        let tls = MakeTls::new(tls, mode, None);
        PgConfig {
            config,
            mode,
            root_cert: None,
            client_cert: None,
            tls,
        }
    }
}

impl From<&Config> for PgConfig {
    fn from(config: &Config) -> Self {
        config.clone().into()
    }
}

impl From<&PgConfig> for PgConfig {
    fn from(config: &PgConfig) -> Self {
        config.clone()
    }
}

/// One line for a connection failure without a server answer: what tokio-postgres says and its
/// causes (its own text stops at "error connecting to server"); a TLS failure says what was wrong,
/// without "error performing TLS handshake" in front.
pub(crate) fn describe(err: &tokio_postgres::Error) -> String {
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(tls) = cause.downcast_ref::<TlsError>() {
            return tls.0.clone();
        }
        if cause.to_string() == "server does not support TLS" {
            return "TLS: the server does not accept TLS connections, and the sslmode \
                    (require, verify-ca or verify-full) refuses to connect without it"
                .to_owned();
        }
        source = cause.source();
    }
    with_causes(err)
}

/// `err: its cause: the cause's cause`, in one line (tokio-postgres's own text leaves causes out).
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !cause_text.is_empty() && !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text.replace('\n', " ")
}
