//! Driving a connection: what the server says on its own (notices) is logged by its severity, a
//! pool's connections are driven the same way, and a connection that cannot be opened is one
//! line naming the hosts and ports tried.

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio_postgres::config::Host;
use tokio_postgres::error::{DbError, Severity};
use tokio_postgres::{AsyncMessage, Client, Config, Connection};

use super::MakeTls;
use crate::error::Error;

/// Drives `connection` until it closes: run it on a task of its own (`tokio::spawn(drive(c))`)
/// in place of awaiting it. A notice is logged by its severity ([`log_notice`]), a connection
/// that fails at `warn`; notifications are dropped (a LISTEN needs `poll_message` of its own).
///
/// tokio-postgres logs every notice at `info` when a connection is awaited directly, so a
/// harmless `NOTICE: relation ... already exists, skipping` of an idempotent statement would
/// reach the operator's log.
pub async fn drive<S, T>(mut connection: Connection<S, T>)
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notice(notice))) => log_notice(&notice),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %super::describe(&e), "database connection closed");
                return;
            }
            None => return,
        }
    }
}

/// Logs a notice the server sent: `WARNING` (and anything graver) at `warn`, `NOTICE`, `INFO`
/// and `LOG` at `debug`, `DEBUG` at `trace`. Notices say what a statement did by the way (an
/// `IF NOT EXISTS` that found the table); a warning may need a person.
pub fn log_notice(notice: &DbError) {
    let (severity, code, message) = (notice.severity(), notice.code().code(), notice.message());
    match notice.parsed_severity() {
        Some(Severity::Notice | Severity::Info | Severity::Log) => {
            tracing::debug!(severity, code, "postgres: {message}")
        }
        Some(Severity::Debug) => tracing::trace!(severity, code, "postgres: {message}"),
        _ => tracing::warn!(severity, code, "postgres: {message}"),
    }
}

/// The pool's way to open a connection ([`super::PgConfig::manager`]): TLS as configured, the
/// connection driven by [`drive`].
pub(super) struct Connector {
    pub(super) tls: MakeTls,
}

impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        config: &Config,
    ) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let (tls, config) = (self.tls.clone(), config.clone());
        Box::pin(async move {
            let (client, connection) = config.connect(tls).await?;
            Ok((client, tokio::spawn(drive(connection))))
        })
    }
}

/// Where `config` connects, as an operator reads it: `host:port` for each host (`[::1]:5432`,
/// a socket as `/run/postgresql/.s.PGSQL.5432`), comma-separated; never the user or password.
pub(super) fn target(config: &Config) -> String {
    let ports = config.get_ports();
    let port = |i: usize| match ports {
        [] => 5432,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(5432),
    };
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{}", port(i)),
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            #[cfg(unix)]
            Host::Unix(dir) => format!("{}/.s.PGSQL.{}", dir.display(), port(i)),
        })
        .collect();
    if hosts.is_empty() {
        format!("(no host):{}", port(0))
    } else {
        hosts.join(", ")
    }
}

/// A failed connection attempt to `target`: an unreachable store names the hosts and ports
/// tried, without tokio-postgres's "error connecting to server" in front; any other error is
/// classified as usual.
pub(super) fn connect_error(target: &str, err: tokio_postgres::Error) -> Error {
    match Error::from(err) {
        Error::StoreUnavailable {
            message: why,
            source,
        } => {
            let why = why
                .strip_prefix("error connecting to server: ")
                .unwrap_or(&why);
            Error::StoreUnavailable {
                message: format!("cannot connect to {target}: {why}"),
                source,
            }
        }
        other => other,
    }
}
