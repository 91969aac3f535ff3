//! txoutbox sink for NATS JetStream: fan-out at scale through a broker. Each row is published
//! with `Nats-Msg-Id` = its downstream key, so JetStream drops a redelivery within the stream's
//! duplicate window; the publish ack is the row's receipt.
//!
//! ```no_run
//! use std::time::Duration;
//! # #[cfg(feature = "sink")]
//! use txoutbox_nats::{NatsMessage, NatsSink, DESTINATION};
//!
//! # #[cfg(feature = "sink")]
//! # async fn example(tx: &tokio_postgres::Transaction<'_>, pg: tokio_postgres::Config)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! // In the business transaction: enqueue the event.
//! let event = NatsMessage::new(serde_json::json!({ "order": 42 })).to_subject("orders.paid");
//! txoutbox::enqueue(tx, &[event.into_outbox_message()?.with_downstream_key("order-42-paid")]).await?;
//!
//! // In the relay: the sink for destination "nats" (DESTINATION).
//! let sink = NatsSink::connect("nats://127.0.0.1:4222").await?;
//! sink.ensure_stream("ORDERS", &["orders.>"], Duration::from_secs(10 * 60)).await?;
//! let relay = txoutbox::relay::Relay::builder(pg).sink(DESTINATION, sink).build()?;
//! relay.run(std::future::pending::<()>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Without the delivery stack
//!
//! The `sink` feature (on by default) carries `NatsSink` and async-nats. A service that only
//! enqueues messages depends on `txoutbox-nats = { version = "0.1", default-features = false }`:
//! [`NatsMessage`], [`check`] and `into_outbox_message` are there. A row enqueued as raw JSON
//! that is not a message is dead-lettered with `malformed payload (build it with
//! txoutbox_nats::NatsMessage): ...`.
//!
//! Layout: `message` holds [`NatsMessage`], the payload a service enqueues (subject and JSON
//! data), its checks ([`check`], [`PayloadError`]) and [`DESTINATION`]; `sink` (feature `sink`) holds [`NatsSink`] (connect, per-destination subject, ack timeout, a stream
//! helper for tests and demos), the classification of publish failures, and
//! [`PublishReceipt`], the stored ack (stream, sequence, duplicate); `consumer` the receiving
//! half, [`JetStreamConsumer`]: a durable pull consumer whose messages a [`MessageHandler`]
//! applies once each, in a transaction with their inbox record ([`txoutbox::inbox`]), acked
//! after the commit.

#[cfg(feature = "consumer")]
mod consumer;
mod message;
#[cfg(feature = "sink")]
mod sink;

#[cfg(feature = "consumer")]
pub use consumer::{
    message_id, ConsumerReport, HandlerError, JetStreamConsumer, MessageHandler,
    DEFAULT_CONCURRENCY, DEFAULT_GRACE, DEFAULT_NAK_DELAY,
};
pub use message::{check, NatsMessage, PayloadError, DESTINATION};
#[cfg(feature = "sink")]
pub use sink::{NatsError, NatsSink, PublishReceipt, DEFAULT_ACK_TIMEOUT, NATS_MSG_ID};
