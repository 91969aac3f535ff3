//! txoutbox sink for HTTP webhooks, signed as [Standard Webhooks]: `webhook-id` is the row's
//! downstream key, so a receiver that deduplicates on it sees a redelivered event once.
//!
//! ```no_run
//! # #[cfg(feature = "sink")]
//! use txoutbox_webhook::{Webhook, WebhookSecret, WebhookSink};
//!
//! # #[cfg(feature = "sink")]
//! # async fn example(tx: &tokio_postgres::Transaction<'_>, pg: tokio_postgres::Config)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! // In the business transaction: enqueue the event for the "webhook:orders" endpoint.
//! let event = Webhook::new("order.paid", serde_json::json!({ "order": 42 }));
//! let message = event.into_outbox_message_for("webhook:orders")?.with_downstream_key("order-42-paid");
//! txoutbox::enqueue(tx, &[message]).await?;
//!
//! // In the relay: one sink per endpoint, each with its own secret.
//! let secret = WebhookSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
//! let orders = WebhookSink::new("https://receiver.example/hooks/orders", secret)?;
//! let relay = txoutbox::relay::Relay::builder(pg).sink("webhook:orders", orders).build()?;
//! relay.run(std::future::pending::<()>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! A receiver checks a request with [`verify`]`(&secret, &headers, &raw_body)` (the published
//! algorithm: HMAC-SHA256 of `{id}.{timestamp}.{body}`, constant-time compared, timestamp
//! within five minutes) and keeps the `webhook-id`s it has processed.
//!
//! # Without the delivery stack
//!
//! The `sink` feature (on by default) carries `WebhookSink` and reqwest. A service that only
//! enqueues webhooks, or only receives them, depends on `txoutbox-webhook = { version = "0.1",
//! default-features = false }`: [`Webhook`], [`check`], `into_outbox_message` and [`verify`]
//! are there. A row enqueued as raw JSON that is not a webhook is dead-lettered with
//! `malformed payload (build it with txoutbox_webhook::Webhook): ...`.
//!
//! Layout: `message` holds [`Webhook`], the payload a service enqueues, [`DESTINATION`], its
//! checks ([`check`], [`PayloadError`]) and the body it becomes; `signature` holds [`WebhookSecret`] (`whsec_` form or raw bytes), [`sign`] and
//! [`verify`]; `sink` holds [`WebhookSink`] and [`WebhookConfig`]: the POST, its timeouts, and
//! the classification of the answer (2xx delivered; 408, 429, 5xx and connections that could
//! not be made retried, honouring `Retry-After`; a timeout or a connection lost once the request
//! was sent indeterminate; other statuses permanent; error bodies cut to a cleaned excerpt),
//! with the `sink` feature.
//!
//! [Standard Webhooks]: https://www.standardwebhooks.com

mod message;
mod signature;
#[cfg(feature = "sink")]
mod sink;

pub use message::{check, PayloadError, Webhook, DESTINATION};
pub use signature::{
    sign, verify, verify_at, SecretError, VerifyError, WebhookSecret, TIMESTAMP_TOLERANCE,
    WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP,
};
#[cfg(feature = "sink")]
pub use sink::{WebhookConfig, WebhookError, WebhookSink};

/// The `http` crate's header map, as [`verify`] takes it (axum's and reqwest's are the same).
pub use http::HeaderMap;
