//! txoutbox sink: email, over SMTP or into a directory of `.eml` files (lettre).
//!
//! ```no_run
//! use txoutbox_email::{Email, EmailSink, DESTINATION};
//!
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
//!   permanent. [`Email::into_outbox_message`] runs the same checks before the row is written.
//! - With several recipients, one refused recipient (5xx to `RCPT TO`) refuses the message.
//!
//! Layout: `message` holds [`Email`], the payload type, and [`DESTINATION`], with its checks and its MIME form;
//! `message_id` holds the Message-ID rule; `hello` the `EHLO` name (a configured one's checks,
//! the default from the host name, `/etc/hosts` or the route to the server; see
//! [`SmtpConfig::hello_name`]); `sink` holds [`EmailSink`] (SMTP through lettre's pooled async
//! transport, or lettre's file transport) and the classification of failures.

mod hello;
mod message;
mod message_id;
mod sink;

pub use message::{Email, DESTINATION};
pub use message_id::message_id;
pub use sink::{EmailSink, SmtpConfig, MAIL_DIR_VAR, SMTP_HELO_NAME_VAR, SMTP_URL_VAR};

/// Why an email or an email sink could not be built.
#[derive(Debug, thiserror::Error)]
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
    /// The outbox refused the message.
    #[error(transparent)]
    Outbox(txoutbox::Error),
    /// The transport configuration is unusable (URL, directory, environment).
    #[error("email transport: {0}")]
    Config(String),
}
