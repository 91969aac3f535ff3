//! txoutbox sink: email, over SMTP or into a directory of `.eml` files (lettre).
//!
//! ```no_run
//! # #[cfg(feature = "sink")]
//! use txoutbox_email::{Email, EmailSink, DESTINATION};
//!
//! # #[cfg(feature = "sink")]
//! # async fn example(
//! #     tx: &tokio_postgres::Transaction<'_>,
//! #     pg: tokio_postgres::Config,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! // In the business transaction: the email is an outbox row, committed with the order.
//! let receipt = Email::new("Shop <shop@example.com>", "ada@example.org", "Your receipt")
//!     .text("Thank you for your order #42.")
//!     .reply_to("support@example.com")
//!     .header("X-Order", "42");
//! txoutbox::enqueue(tx, &[receipt.into_outbox_message()?.with_downstream_key("order-42-receipt")]).await?;
//!
//! // In the relay: deliver the "email" rows over SMTP (STARTTLS required, pooled connections).
//! let sink = EmailSink::smtp("smtp://relay-user:secret@mail.example.com:587?tls=required")?;
//! let relay = txoutbox::relay::Relay::builder(pg).sink(DESTINATION, sink).build()?;
//! relay.run(async { /* until shutdown */ }).await?;
//! # Ok(()) }
//! ```
//!
//! Inside an idempotent request, `claim.enqueue("receipt", email.into_outbox_message()?)` derives the
//! downstream key from the request's key instead.
//!
//! # One row, one Message-ID
//!
//! Every attempt of an outbox row sends the same message, built from the row:
//!
//! - `Message-ID: <{key}@{domain}>`, where `{key}` is the row's downstream key and `{domain}` the
//!   From address's domain, or [`EmailSink::with_message_id_domain`]'s. A key character outside
//!   RFC 5322 `atext`, a `%`, or a dot that would lead, trail or double is written `%XX`
//!   (`digest:2026-12-02` → `digest%3A2026-12-02`); derived keys are UUIDs and pass unchanged.
//!   [`message_id`] computes it.
//! - `Idempotency-Key: {key}`, for receivers (mail APIs, your own inbound hooks) that deduplicate
//!   on it.
//! - `Date` is the row's enqueue time and the multipart boundary is derived from the key, so a
//!   redelivery is byte for byte the same message.
//!
//! What deduplicates: mail clients and many mail stores (Gmail, Dovecot's duplicate filter,
//! mailing-list software) drop a second message with a Message-ID they already have. What does
//! not: SMTP itself. A relay that crashes after the server accepted a message and before the
//! completion committed sends it again, and the server queues a second copy with the same
//! Message-ID; whether the person sees one email or two is up to their mailbox.
//!
//! # Failures
//!
//! - An SMTP 5xx reply (unknown recipient, refused content, failed authentication) is
//!   permanent: the row is dead-lettered at once with the reply code and text.
//! - A 4xx reply, a refused or dropped connection, a timeout ([`SmtpConfig::timeout`]) or TLS
//!   trouble is retryable: the relay backs off and tries again with the same Message-ID.
//! - A payload that is not a valid [`Email`] (bad address, no body, header injection) is
//!   permanent, and the attempt's error names the builder (`malformed payload (build it with
//!   txoutbox_email::Email): ...`). [`Email::into_outbox_message`] runs the same checks before
//!   the row is written, and [`check`] runs them on raw JSON.
//!
//! # Without the delivery stack
//!
//! The `sink` feature (on by default) carries [`EmailSink`] and lettre. A service that only
//! enqueues emails depends on `txoutbox-email = { version = "0.1", default-features = false }`:
//! [`Email`], [`check`] and [`Email::into_outbox_message`] are there, and addresses are read
//! exactly as the sink's lettre reads them (the same grammar and checks, without lettre).
//! - With several recipients, one refused recipient (5xx to `RCPT TO`) refuses the message.
//!
//! Layout: `message` holds [`Email`], the payload type, and [`DESTINATION`], with its checks and
//! (feature `sink`) its MIME form; `address` reads addresses as lettre does;
//! `message_id` holds the Message-ID rule; `hello` the `EHLO` name (a configured one's checks,
//! the default from the host name, `/etc/hosts` or the route to the server; see
//! [`SmtpConfig::hello_name`]); `sink` holds [`EmailSink`] (SMTP through lettre's pooled async
//! transport, or lettre's file transport) and the classification of failures.

mod address;
#[cfg(feature = "sink")]
mod hello;
mod message;
mod message_id;
#[cfg(feature = "sink")]
mod sink;

pub use message::{Email, DESTINATION};
pub use message_id::message_id;
#[cfg(feature = "sink")]
pub use sink::{EmailSink, SmtpConfig, MAIL_DIR_VAR, SMTP_HELO_NAME_VAR, SMTP_URL_VAR};

/// Checks a raw JSON payload for the "email" destination as the sink will read it: the shape of
/// an [`Email`] (no unknown field) and every check of [`Email::into_outbox_message`]. For code
/// that enqueues `OutboxMessage::new("email", &json)` rather than building an [`Email`]:
///
/// ```
/// let payload = serde_json::json!({"from": "shop@example.com", "to": ["ada@example.org"],
///                                  "subject": "Your receipt", "text": "Thanks!"});
/// txoutbox_email::check(&payload)?;
/// let wrong = serde_json::json!({"from": "shop@example.com", "to": "ada@example.org"});
/// assert!(txoutbox_email::check(&wrong).is_err());
/// # Ok::<(), txoutbox_email::EmailError>(())
/// ```
pub fn check(payload: &serde_json::Value) -> Result<(), EmailError> {
    Email::from_payload(payload).map(|_| ())
}

/// Why an email or an email sink could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmailError {
    /// An address does not parse (`field` is `from`, `to`, `cc`, `bcc` or `reply-to`).
    #[error("invalid {field} address {address:?}: {reason}")]
    InvalidAddress {
        /// Which field held it.
        field: &'static str,
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The email has no `To` recipient.
    #[error("an email needs at least one To recipient")]
    NoRecipient,
    /// The email has neither a text nor an HTML body.
    #[error("an email needs a text or an HTML body")]
    NoBody,
    /// A header (or the subject) cannot be written as given.
    #[error("invalid header {name:?}: {reason}")]
    InvalidHeader {
        /// The header's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A Message-ID domain is not a domain.
    #[error("invalid Message-ID domain {domain:?}: {reason}")]
    InvalidDomain {
        /// The domain as given.
        domain: String,
        /// What is wrong with it.
        reason: String,
    },
    /// lettre refused to build the message.
    #[error("the email cannot be built: {0}")]
    Build(String),
    /// A payload is not an [`Email`]'s JSON (a missing or unknown field, a wrong type).
    #[error("not an email payload: {0}")]
    NotAnEmail(#[source] serde_json::Error),
    /// The transport configuration is unusable (URL, directory, environment).
    #[error("email transport: {0}")]
    Config(String),
}

/// A transport that cannot be configured is [`txoutbox::Error::Config`]; any other refusal is
/// the payload's: [`txoutbox::Error::InvalidPayload`], this error its source (422 in a handler).
impl From<EmailError> for txoutbox::Error {
    fn from(err: EmailError) -> Self {
        match err {
            EmailError::Config(text) => txoutbox::Error::Config(format!("email transport: {text}")),
            other => txoutbox::Error::invalid_payload(other),
        }
    }
}
