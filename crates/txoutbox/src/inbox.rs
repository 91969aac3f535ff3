//! The receiving half: an inbox that turns every at-least-once delivery of a message into one
//! effect, in the receiving service's own business transaction.
//!
//! A receiver of webhooks or broker messages calls [`receive`] with the message's id inside the
//! transaction that applies the message. The first delivery gets [`Receive::New`]: the handler
//! runs, and its record (consumer, message id, first received, expiry) commits with its business
//! rows or not at all. A redelivery finds the record and gets [`Receive::Duplicate`]: acknowledge
//! it without running the handler. A redelivery racing a slow first attempt waits for it on the
//! record's insert (a transaction-scoped lock), then answers `Duplicate`, or [`Error::Conflict`]
//! (409) after the consumer's lock timeout.
//!
//! ```
//! use txoutbox::inbox::{self, Consumer, Receive};
//! use txoutbox::OutboxMessage;
//!
//! # async fn handle(client: &mut tokio_postgres::Client, message_id: &str)
//! #     -> Result<(), txoutbox::Error> {
//! let consumer = Consumer::new("shipping")?; // 7-day window by default
//! let tx = client.transaction().await?;
//! match inbox::receive(&tx, &consumer, message_id).await? {
//!     Receive::New(mut claim) => {
//!         tx.execute("INSERT INTO shipments (charge_id) VALUES ('ch_1')", &[]).await?;
//!         claim.enqueue("ships-email", OutboxMessage::new("email", &serde_json::json!({"to": "a@b.c"}))?)?;
//!         claim.complete(&tx).await?;
//!         tx.commit().await?;
//!     }
//!     Receive::Duplicate { .. } => {} // applied before: acknowledge, change nothing
//! }
//! # Ok(())
//! # }
//! # txoutbox_test_support::doc_test(|mut client| async move {
//! #     client.batch_execute("CREATE TABLE shipments (charge_id text)").await?;
//! #     handle(&mut client, "msg-1").await?;
//! #     handle(&mut client, "msg-1").await?; // the redelivery
//! #     let shipments: i64 = client.query_one("SELECT count(*) FROM shipments", &[]).await?.get(0);
//! #     assert_eq!((shipments, txoutbox_test_support::counts(&client).await?.pending), (1, 1));
//! #     Ok(())
//! # });
//! ```
//!
//! Effects enqueued on the claim get downstream keys derived from (consumer, message id,
//! effect) ([`derive_inbox_downstream_key`]): every delivery of one message gives each effect the
//! same key, so a chain A → B → C keeps one key per hop and per effect.
//!
//! The window: a record lives for its consumer's window ([`DEFAULT_WINDOW`], 7 days), longer
//! than any sender's retry budget (our relay's default policy gives up within hours, Svix's
//! schedule within about a day and a half, Stripe's webhooks within three days). `txoutbox purge` prunes expired records in bounded batches; a message arriving
//! after its record expired is new again, as a request after its key's window is.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::downstream_key::DOWNSTREAM_KEY_NAMESPACE;
use crate::error::{Error, Result};
use crate::idempotency::{check_lock_timeout, check_window, Effects};
use crate::outbox::{check_name, enqueue, Enqueued, OutboxMessage};
use crate::store::driver::{StoreError, WriteTx};
use crate::store::inbox::{self as store, Recorded};

/// The default window: a redelivery within 7 days of the first delivery is a duplicate. Longer
/// than any sender's retry budget, so no retry of a message arrives after its record is gone.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How long a delivery waits for a concurrent delivery of the same message before
/// [`Error::Conflict`] (409): the sender retries, and the retry is a duplicate.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// A receiving handler: its name (one message-id space per consumer) and its window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    name: String,
    window: Duration,
    lock_timeout: Duration,
}

impl Consumer {
    /// A consumer with the default window (7 days) and lock timeout (2 s). Fails with
    /// [`Error::Invalid`] for an empty name, one over 255 bytes, or one with control characters.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        check_name("consumer", &name)?;
        Ok(Self {
            name,
            window: DEFAULT_WINDOW,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        })
    }

    /// How long a message's record is kept. Make it longer than the longest time a sender may
    /// go on retrying one message; fails with [`Error::Config`] outside 1 ms..=100 years.
    pub fn with_window(mut self, window: Duration) -> Result<Self> {
        check_window(&format!("consumer {:?}", self.name), window)?;
        self.window = window;
        Ok(self)
    }

    /// How long a delivery waits for a concurrent delivery of the same message; fails with
    /// [`Error::Config`] outside 1 ms..=60 s.
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_lock_timeout(&format!("consumer {:?}", self.name), timeout)?;
        self.lock_timeout = timeout;
        Ok(self)
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long a record is kept.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How long a delivery waits for a concurrent one of the same message.
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    fn record<'a>(
        &'a self,
        message_id: &'a str,
        timeout: &'a str,
        failed: Option<&'a str>,
    ) -> store::Record<'a> {
        store::Record {
            consumer: &self.name,
            message_id,
            window_secs: self.window.as_secs_f64(),
            lock_timeout: timeout,
            outcome: if failed.is_some() {
                "failed"
            } else {
                "processed"
            },
            error: failed,
        }
    }
}

/// What became of a message whose record a redelivery found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and committed.
    Processed,
    /// The handler failed for good and the message was given up ([`record_failure`]).
    Failed,
}

/// The outcome of [`receive`].
#[derive(Debug)]
#[must_use = "a New claim runs the handler; complete it (Claim::complete) before commit"]
pub enum Receive {
    /// The first delivery (or the first after the record's window): run the handler, enqueue
    /// its effects on the claim, [`InboxClaim::complete`], then commit.
    New(InboxClaim),
    /// The message was received before: acknowledge it (2xx, ack) without running the handler.
    Duplicate {
        /// When it was first received.
        first_received: DateTime<Utc>,
        /// What became of it.
        outcome: Outcome,
    },
}

/// A message received for the first time: the right to apply it once, and where its onward
/// effects are enqueued.
#[derive(Debug)]
pub struct InboxClaim {
    consumer: String,
    message_id: String,
    received_at: DateTime<Utc>,
    effects: Effects,
}

/// Checks a message id: 1..=255 bytes, no control characters (they are joined by newlines where
/// downstream keys are derived, and Postgres text holds no NUL).
fn check_message_id(message_id: &str) -> Result<()> {
    check_name("message id", message_id)
}

/// Records `message_id` as received by `consumer` inside the caller's transaction, or finds
/// that it was received before.
///
/// `tx` is the caller's transaction on any driver of the write path ([`WriteTx`]): `&tx` of a
/// tokio-postgres or deadpool transaction, `&mut tx` of a `sqlx::Transaction<'_, Postgres>` or
/// `&mut *conn` of a `sqlx::PgConnection` inside a transaction (the `sqlx` feature).
///
/// The record commits with the caller's transaction: roll back (a handler error) and the message
/// is new again for the redelivery. A concurrent delivery of the same id waits for this
/// transaction (up to the consumer's lock timeout), then answers `Duplicate` if this one
/// committed, `New` if it rolled back. A wait that times out, a serialization failure (a record
/// committed after a REPEATABLE READ or SERIALIZABLE snapshot) or a deadlock is
/// [`Error::Conflict`] (409): the transaction is aborted; roll it back, and the sender's retry
/// finds the record.
///
/// Fails with [`Error::Invalid`] for an empty message id, one over 255 bytes or one with control
/// characters, before anything is written.
pub async fn receive(
    mut tx: impl WriteTx,
    consumer: &Consumer,
    message_id: &str,
) -> Result<Receive> {
    check_message_id(message_id)?;
    let timeout = format!("{}ms", consumer.lock_timeout.as_millis().max(1));
    let recorded = store::record(&mut tx, &consumer.record(message_id, &timeout, None)).await;
    match recorded {
        Ok(Recorded::New(received_at)) => Ok(Receive::New(InboxClaim {
            consumer: consumer.name.clone(),
            message_id: message_id.to_owned(),
            received_at,
            effects: Effects::new(),
        })),
        Ok(Recorded::Found(first_received, outcome)) => Ok(Receive::Duplicate {
            first_received,
            outcome: if outcome == "failed" {
                Outcome::Failed
            } else {
                Outcome::Processed
            },
        }),
        Ok(Recorded::Vanished) => Err(Error::conflict(format!(
            "the inbox record of {message_id:?} was pruned while this delivery waited for it"
        ))),
        Err(e) => Err(conflict(e, message_id)),
    }
}

/// Records that `consumer` gave `message_id` up: its handler failed for good (a poison message,
/// a payload it cannot read). Run it in a transaction of its own, after the handler's was rolled
/// back; a redelivery then answers [`Receive::Duplicate`] with [`Outcome::Failed`], and an
/// operator finds the error with the record. Returns false when the message already has a live
/// record (it was processed meanwhile, or given up before). `error` is cut to 1 000 characters.
pub async fn record_failure(
    mut tx: impl WriteTx,
    consumer: &Consumer,
    message_id: &str,
    error: &str,
) -> Result<bool> {
    check_message_id(message_id)?;
    let timeout = format!("{}ms", consumer.lock_timeout.as_millis().max(1));
    let error: String = error
        .chars()
        .filter(|c| *c != '\0')
        .take(1_000)
        .collect::<String>();
    let recorded = store::record(
        &mut tx,
        &consumer.record(message_id, &timeout, Some(&error)),
    )
    .await
    .map_err(|e| conflict(e, message_id))?;
    Ok(matches!(recorded, Recorded::New(_)))
}

/// The error of a record's statement: a wait given up or lost is a conflict (409).
fn conflict(e: StoreError, message_id: &str) -> Error {
    if e.held_elsewhere() {
        return Error::Conflict {
            message: format!(
                "a concurrent delivery of message {message_id:?} holds its inbox record"
            ),
            source: e.into_source(),
        };
    }
    e.into()
}

/// The downstream key of effect `effect` enqueued while applying message `message_id` of
/// `consumer`: `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "inbox\n{consumer}\n{message_id}\n{effect}")`,
/// hyphenated lower case. Every delivery of the message gives the effect this key, so its
/// downstream deduplicates it however often the message arrives (after the record's window too).
pub fn derive_inbox_downstream_key(consumer: &str, message_id: &str, effect: &str) -> String {
    let name = format!("inbox\n{consumer}\n{message_id}\n{effect}");
    Uuid::new_v5(&DOWNSTREAM_KEY_NAMESPACE, name.as_bytes()).to_string()
}

impl InboxClaim {
    /// Enqueues one onward effect of this message, its downstream key derived from (consumer,
    /// message id, `effect`) unless the message carries one ([`InboxClaim::downstream_key`]).
    /// Each effect name may be used once per message.
    pub fn enqueue(&mut self, effect: &str, message: OutboxMessage) -> Result<&mut Self> {
        let derive = || derive_inbox_downstream_key(&self.consumer, &self.message_id, effect);
        self.effects.push(effect, message, derive)?;
        Ok(self)
    }

    /// The downstream key the effect named `effect` gets ([`derive_inbox_downstream_key`]).
    pub fn downstream_key(&self, effect: &str) -> String {
        derive_inbox_downstream_key(&self.consumer, &self.message_id, effect)
    }

    /// Attaches the trace context to every effect that does not carry its own `traceparent`.
    pub fn with_traceparent(&mut self, traceparent: &str) -> Result<&mut Self> {
        self.effects.set_traceparent(traceparent)?;
        Ok(self)
    }

    /// The message id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// When the message was received (the transaction's time, stored on the record).
    pub fn received_at(&self) -> DateTime<Utc> {
        self.received_at
    }

    /// Writes the buffered effects in the caller's transaction (nothing when there are none),
    /// on any driver ([`WriteTx`]: `&tx`, or `&mut tx` on sqlx); the caller then commits. An effect whose (destination, downstream key) is still in the
    /// outbox is skipped ([`Enqueued::skipped`]).
    pub async fn complete(self, tx: impl WriteTx) -> Result<Enqueued> {
        let messages = self.effects.into_messages();
        if messages.is_empty() {
            return Ok(Enqueued::default());
        }
        enqueue(tx, &messages).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbox_keys_follow_the_documented_rule_and_differ_per_effect_and_consumer() {
        let a = derive_inbox_downstream_key("shipping", "msg_1", "email");
        let expected =
            Uuid::new_v5(&DOWNSTREAM_KEY_NAMESPACE, b"inbox\nshipping\nmsg_1\nemail").to_string();
        assert_eq!(a, expected);
        assert_ne!(a, derive_inbox_downstream_key("shipping", "msg_1", "label"));
        assert_ne!(a, derive_inbox_downstream_key("billing", "msg_1", "email"));
        assert_ne!(a, derive_inbox_downstream_key("shipping", "msg_2", "email"));
    }

    #[test]
    fn message_ids_with_control_characters_or_no_text_are_refused() {
        assert!(check_message_id("msg_2a").is_ok());
        assert!(check_message_id("").is_err());
        assert!(check_message_id("a\nb").is_err());
        assert!(check_message_id("a\0b").is_err());
        assert!(check_message_id(&"x".repeat(256)).is_err());
    }

    #[test]
    fn windows_and_timeouts_out_of_range_are_refused() -> Result<()> {
        let c = Consumer::new("shipping")?;
        assert_eq!(c.window(), DEFAULT_WINDOW);
        assert!(c.clone().with_window(Duration::ZERO).is_err());
        assert!(c.clone().with_lock_timeout(Duration::ZERO).is_err());
        assert!(c.with_lock_timeout(Duration::from_secs(61)).is_err());
        assert!(Consumer::new("").is_err());
        Ok(())
    }
}
