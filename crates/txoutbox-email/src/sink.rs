//! `EmailSink`: delivers "email" rows over SMTP (a pooled lettre transport) or into a directory of
//! `.eml` files, and tells the relay what a failure means.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use lettre::transport::smtp::extension::ClientId;
use lettre::transport::smtp::response::Response;
use lettre::transport::smtp::{AsyncSmtpTransportBuilder, PoolConfig};
use lettre::{AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use tokio::sync::OnceCell;
use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};

use crate::message_id::check_domain;
use crate::{hello, Email, EmailError};

/// The environment variable [`EmailSink::from_env`] reads for an SMTP server URL.
pub const SMTP_URL_VAR: &str = "SMTP_URL";
/// The environment variable [`EmailSink::from_env`] reads for a directory of `.eml` files.
pub const MAIL_DIR_VAR: &str = "MAIL_DIR";
/// The environment variable [`EmailSink::from_env`] reads for the SMTP `EHLO` name (see
/// [`SmtpConfig::hello_name`]).
pub const SMTP_HELO_NAME_VAR: &str = "SMTP_HELO_NAME";

/// What makes a valid payload, as the attempt log names it.
const BUILDER: &str = "txoutbox_email::Email";

/// SMTP knobs; [`SmtpConfig::default`] suits most servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpConfig {
    /// The longest one attempt may take, connecting included (default 20 s). The sink reports
    /// it as its [`Sink::timeout`], and the relay refuses to start with a lease that cannot hold
    /// it (the default lease, 30 s, can); else another relay could deliver the row meanwhile.
    pub timeout: Duration,
    /// Idle connections kept open for the next messages (default 10).
    pub pool_max_idle: u32,
    /// An idle connection is closed after this long (default 60 s).
    pub pool_idle_timeout: Duration,
    /// The name sent in `EHLO`: this host's fully qualified name (`relay1.example.com`) or an
    /// address literal (`[192.0.2.1]`, `[IPv6:2001:db8::1]`; a bare IP address is sent as one).
    /// A name without a dot, or with a space or a control character, is refused.
    ///
    /// By default (`None`, and no name in the URL's path as lettre allows,
    /// `smtp://host:25/relay1.example.com`): the host name if it has a dot; else the first
    /// dotted name on the `/etc/hosts` line that lists the host name, as `hostname -f` finds it;
    /// else the literal of the local address that routes to the SMTP server, learned at the first
    /// delivery (`[10.0.3.7]`). Never a bare host name such as a container's `3f2a9c`, which
    /// RFC 5321 (4.1.4) does not allow and some servers refuse.
    pub hello_name: Option<String>,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(20),
            pool_max_idle: 10,
            pool_idle_timeout: Duration::from_secs(60),
            hello_name: None,
        }
    }
}

/// The sink of the "email" destination: register it with `Relay::builder(..).sink(DESTINATION, sink)`.
///
/// Every attempt of a row sends the same message: `Message-ID: <{key}@{domain}>` and
/// `Idempotency-Key: {key}` from the row's downstream key, `Date` from its enqueue time.
pub struct EmailSink {
    transport: Transport,
    message_id_domain: Option<String>,
}

enum Transport {
    Smtp(Box<Smtp>),
    File {
        mailer: AsyncFileTransport<Tokio1Executor>,
        dir: PathBuf,
    },
}

/// An SMTP transport and what it needs to learn its EHLO name.
struct Smtp {
    /// The transport once its EHLO name is known: at once when it is configured or the host has
    /// a fully qualified name, at the first delivery when it is the local address towards the
    /// server (which may not resolve yet when the sink is built).
    named: OnceCell<Named>,
    /// The transport without its EHLO name, for the build at the first delivery.
    unnamed: AsyncSmtpTransportBuilder,
    /// The server's host (without brackets) and port, to find the route to it.
    host: String,
    port: u16,
    /// `host:port`, for errors and logs (never the credentials).
    server: String,
    timeout: Duration,
}

struct Named {
    hello: ClientId,
    mailer: AsyncSmtpTransport<Tokio1Executor>,
}

impl Smtp {
    async fn mailer(&self) -> Result<&AsyncSmtpTransport<Tokio1Executor>, DeliveryError> {
        let named = self
            .named
            .get_or_try_init(|| async {
                let hello = hello::route_literal(&self.host, self.port)
                    .await
                    .map_err(|e| {
                        DeliveryError::retryable(format!(
                            "SMTP server {}: finding the local address towards it (the EHLO \
                             name): {e}",
                            self.server
                        ))
                    })?;
                tracing::info!(
                    server = %self.server,
                    %hello,
                    "EHLO name: the local address towards the SMTP server"
                );
                Ok::<_, DeliveryError>(Named {
                    mailer: self.unnamed.clone().hello_name(hello.clone()).build(),
                    hello,
                })
            })
            .await?;
        Ok(&named.mailer)
    }
}

impl EmailSink {
    /// Sends over SMTP, from a URL:
    ///
    /// | URL | connection |
    /// |---|---|
    /// | `smtp://host:port` | plain text (a local relay, tests) |
    /// | `smtp://host:587?tls=opportunistic` | STARTTLS when the server offers it |
    /// | `smtp://host:587?tls=required` | STARTTLS or fail |
    /// | `smtps://host:465` | implicit TLS |
    ///
    /// `user:password@` before the host authenticates (PLAIN or LOGIN; percent-encode special
    /// characters). Connections are pooled. Must be called inside a Tokio runtime (the pool
    /// starts a cleanup task), and the sink dropped inside one too (the pool closes its
    /// connections on a task).
    pub fn smtp(url: &str) -> Result<Self, EmailError> {
        Self::smtp_with(url, SmtpConfig::default())
    }

    /// [`EmailSink::smtp`] with explicit timeouts, pool sizes and `EHLO` name.
    pub fn smtp_with(url: &str, config: SmtpConfig) -> Result<Self, EmailError> {
        let parsed = url::Url::parse(url)
            .map_err(|e| EmailError::Config(format!("the SMTP URL does not parse: {e}")))?;
        if !matches!(parsed.scheme(), "smtp" | "smtps") {
            return Err(EmailError::Config(format!(
                "the SMTP URL's scheme is {:?}; use smtp:// or smtps://",
                parsed.scheme()
            )));
        }
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| EmailError::Config("the SMTP URL has no host".to_owned()))?;
        let server = match parsed.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        // The configured name, else lettre's name from the URL's path, checked the same way.
        let path = parsed.path().trim_matches('/');
        let configured = match (&config.hello_name, path) {
            (Some(name), _) => Some((name.as_str(), "hello_name")),
            (None, "") => None,
            (None, name) => Some((name, "the SMTP URL's path")),
        };
        let hello = match configured {
            Some((name, setting)) => Some(hello::parse(name).map_err(|reason| {
                EmailError::Config(format!(
                    "{setting} {name:?} cannot be the EHLO name: {reason}"
                ))
            })?),
            None => hello::host_fqdn().map(ClientId::Domain),
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(EmailError::Config(
                "EmailSink::smtp must be called inside a Tokio runtime".to_owned(),
            ));
        }
        let unnamed = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            // lettre's message never echoes the URL, so no password reaches a log.
            .map_err(|e| EmailError::Config(format!("SMTP server {server}: {e}")))?
            .timeout(Some(config.timeout))
            .pool_config(
                PoolConfig::new()
                    .max_size(config.pool_max_idle.max(1))
                    .idle_timeout(config.pool_idle_timeout),
            );
        let named = hello.map(|hello| Named {
            mailer: unnamed.clone().hello_name(hello.clone()).build(),
            hello,
        });
        // Routing depends on the server's address, not on its port.
        let route_host = match parsed.host() {
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            _ => host.to_owned(),
        };
        Ok(Self {
            transport: Transport::Smtp(Box::new(Smtp {
                named: OnceCell::new_with(named),
                unnamed,
                host: route_host,
                port: parsed.port().unwrap_or(25),
                server,
                timeout: config.timeout,
            })),
            message_id_domain: None,
        })
    }

    /// Writes each message as `{dir}/{uuid}.eml` (lettre's file transport), creating `dir` if
    /// needed: for development, tests and services that hand mail to another process.
    pub fn file_dir(dir: impl AsRef<Path>) -> Result<Self, EmailError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| {
            EmailError::Config(format!("the mail directory {}: {e}", dir.display()))
        })?;
        Ok(Self {
            transport: Transport::File {
                mailer: AsyncFileTransport::new(&dir),
                dir,
            },
            message_id_domain: None,
        })
    }

    /// From the environment: `SMTP_URL` (see [`EmailSink::smtp`]) if set, with `SMTP_HELO_NAME`
    /// as its `EHLO` name if set ([`SmtpConfig::hello_name`]); else `MAIL_DIR` (see
    /// [`EmailSink::file_dir`]). Neither set is an error rather than mail silently going nowhere.
    pub fn from_env() -> Result<Self, EmailError> {
        Self::from_env_with(SmtpConfig::default())
    }

    /// [`EmailSink::from_env`] with explicit SMTP knobs; `SMTP_HELO_NAME`, when set, replaces
    /// `config.hello_name`.
    pub fn from_env_with(mut config: SmtpConfig) -> Result<Self, EmailError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(url) = var(SMTP_URL_VAR) {
            if let Some(name) = var(SMTP_HELO_NAME_VAR) {
                let name = name.trim();
                hello::parse(name).map_err(|reason| {
                    EmailError::Config(format!(
                        "{SMTP_HELO_NAME_VAR} {name:?} cannot be the EHLO name: {reason}"
                    ))
                })?;
                config.hello_name = Some(name.to_owned());
            }
            return Self::smtp_with(url.trim(), config);
        }
        if let Some(dir) = var(MAIL_DIR_VAR) {
            return Self::file_dir(dir);
        }
        Err(EmailError::Config(format!(
            "set {SMTP_URL_VAR} (smtp://host:port, smtps://...) or {MAIL_DIR_VAR} (a directory for .eml files)"
        )))
    }

    /// Uses `domain` on the right of every Message-ID instead of the From address's domain.
    /// Keep it stable: a changed domain makes a redelivery a new message to the receiver.
    pub fn with_message_id_domain(mut self, domain: impl Into<String>) -> Result<Self, EmailError> {
        let domain = domain.into();
        check_domain(&domain).map_err(|reason| EmailError::InvalidDomain {
            domain: domain.clone(),
            reason,
        })?;
        self.message_id_domain = Some(domain);
        Ok(self)
    }

    /// The Message-ID this sink gives the row with downstream key `key` carrying `email`.
    pub fn message_id_for(&self, email: &Email, key: &str) -> Result<String, EmailError> {
        let domain = match &self.message_id_domain {
            Some(d) => d.clone(),
            None => email.sender_domain()?,
        };
        check_domain(&domain).map_err(|reason| EmailError::InvalidDomain {
            domain: domain.clone(),
            reason,
        })?;
        Ok(crate::message_id(key, &domain))
    }
}

impl fmt::Debug for EmailSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("EmailSink");
        match &self.transport {
            Transport::Smtp(smtp) => s
                .field("smtp", &smtp.server)
                .field("timeout", &smtp.timeout)
                .field(
                    "hello_name",
                    &smtp.named.get().map(|named| named.hello.to_string()),
                ),
            Transport::File { dir, .. } => s.field("dir", dir),
        };
        s.field("message_id_domain", &self.message_id_domain)
            .finish()
    }
}

#[async_trait::async_trait]
impl Sink for EmailSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let email = Email::from_payload(&delivery.payload)
            .map_err(|e| DeliveryError::malformed_payload(BUILDER, e))?;
        let (message, message_id) = email
            .to_message(
                &delivery.downstream_key,
                self.message_id_domain.as_deref(),
                SystemTime::from(delivery.created_at),
            )
            .map_err(|e| DeliveryError::permanent(format!("the email cannot be sent: {e}")))?;
        tracing::debug!(%message_id, "sending email");
        match &self.transport {
            Transport::Smtp(smtp) => {
                let send =
                    async { Ok::<_, DeliveryError>(smtp.mailer().await?.send(message).await) };
                let (server, timeout) = (&smtp.server, smtp.timeout);
                match tokio::time::timeout(timeout, send).await {
                    Ok(Ok(Ok(response))) => Ok(Receipt::new(reply_text(&response))),
                    Ok(Ok(Err(e))) => Err(classify(server, &e)),
                    Ok(Err(unroutable)) => Err(unroutable),
                    // The server may have taken the message already: the outcome is unknown. An
                    // at-least-once destination retries it with the same Message-ID (a receiver
                    // that deduplicates shows it once); an at-most-once one leaves it `unknown`.
                    Err(_) => Err(DeliveryError::indeterminate(format!(
                        "SMTP server {server}: no answer within {timeout:?}"
                    ))),
                }
            }
            Transport::File { mailer, dir } => match mailer.send(message).await {
                Ok(id) => Ok(Receipt::new(
                    dir.join(format!("{id}.eml")).display().to_string(),
                )),
                Err(e) => Err(DeliveryError::retryable(format!(
                    "writing the email into {}: {e}",
                    dir.display()
                ))),
            },
        }
    }

    /// SMTP: [`SmtpConfig::timeout`], which bounds the whole call (connecting, `EHLO`, TLS,
    /// authentication and the message). The file transport has none: a local write has no peer
    /// to wait for, and one stuck on a hung filesystem is cut off by the relay at its call limit
    /// (the lease less a margin), so any lease suits it.
    fn timeout(&self) -> Option<Duration> {
        match &self.transport {
            Transport::Smtp(smtp) => Some(smtp.timeout),
            Transport::File { .. } => None,
        }
    }
}

/// `250 2.0.0 Ok: queued as 12`: the reply code and text, on one line.
fn reply_text(response: &Response) -> String {
    let lines: Vec<&str> = response.message().collect();
    format!("{} {}", response.code(), lines.join(" "))
        .trim_end()
        .to_owned()
}

/// A 5xx reply is final (the server refused this message: dead-letter it); everything else —
/// 4xx, refused or dropped connections, timeouts, TLS and protocol trouble — may pass.
fn classify(server: &str, e: &lettre::transport::smtp::Error) -> DeliveryError {
    let message = format!("SMTP server {server}: {e}");
    if e.is_permanent() {
        DeliveryError::permanent(message)
    } else {
        DeliveryError::retryable(message)
    }
}

#[cfg(test)]
mod tests;
