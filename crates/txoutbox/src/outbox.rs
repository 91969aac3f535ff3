//! Outbox messages: the downstream effects a transaction enqueues, and their downstream keys.

use std::collections::BTreeMap;

use serde::Serialize;
use uuid::Uuid;

use crate::downstream_key::check_downstream_key;
use crate::error::{Error, Result};
use crate::store::driver::{Statements, WriteTx};
use crate::store::messages::MessageColumns;

/// What one enqueue wrote ([`enqueue`], [`crate::idempotency::Claim::complete`]), by message id
/// ([`OutboxMessage::id`]), in the order given.
///
/// A message whose (destination, downstream key) is already in `txoutbox_messages` (pending, in
/// flight, dead-lettered or `unknown`) is not written: it is listed in [`Enqueued::skipped`], and
/// this enqueue will not deliver it (the row already there will, or did not). A row delivered and
/// moved to `txoutbox_delivered` is no duplicate: the message is written again, and carries the
/// same downstream key, which the downstream deduplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enqueued {
    written: Vec<Uuid>,
    skipped: Vec<Uuid>,
}

impl Enqueued {
    /// Splits the `given` ids into those the insert returned and the others.
    pub(crate) fn new(given: &[Uuid], returned: &[Uuid]) -> Self {
        let returned: std::collections::HashSet<&Uuid> = returned.iter().collect();
        let (written, skipped) = given.iter().partition(|id| returned.contains(id));
        Self { written, skipped }
    }

    /// The messages written: each is a new outbox row.
    pub fn written(&self) -> &[Uuid] {
        &self.written
    }

    /// The messages not written, because a row with their (destination, downstream key) is
    /// already in the outbox (a second message with the same pair in one call included).
    pub fn skipped(&self) -> &[Uuid] {
        &self.skipped
    }

    /// True when every message was written.
    pub fn all_written(&self) -> bool {
        self.skipped.is_empty()
    }
}

/// One downstream effect to deliver after commit: a destination (the sink's name), a JSON payload,
/// optional headers, its downstream key and an optional ordering key.
///
/// Enqueue it in a request ([`Claim::enqueue`](crate::Claim::enqueue), which derives its
/// downstream key) or outside one ([`enqueue`], with a downstream key of the caller's).
///
/// ```
/// use txoutbox::OutboxMessage;
///
/// let message = OutboxMessage::new("email", &serde_json::json!({"to": "ada@example.com"}))?
///     .with_downstream_key("invoice-2026-12-ada")
///     .with_ordering_key("customer-ada") // delivered after the customer's earlier rows
///     .with_header("tenant", "acme");
/// assert_eq!(message.destination(), "email");
/// assert_eq!(message.downstream_key(), Some("invoice-2026-12-ada"));
/// assert!(OutboxMessage::new("", &1).is_err(), "a message has a destination");
/// # Ok::<(), txoutbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    pub(crate) id: Uuid,
    pub(crate) destination: String,
    pub(crate) payload: serde_json::Value,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) downstream_key: Option<String>,
    pub(crate) ordering_key: Option<String>,
}

impl OutboxMessage {
    /// A message for `destination` carrying `payload` serialised with serde.
    ///
    /// Fails with [`Error::Payload`] when the payload does not serialise (a map with non-string
    /// keys, a failing `Serialize` impl), and with [`Error::Invalid`] for an empty destination.
    pub fn new<T: Serialize + ?Sized>(destination: &str, payload: &T) -> Result<Self> {
        check_name("destination", destination)?;
        Ok(Self {
            id: Uuid::now_v7(),
            destination: destination.to_owned(),
            payload: serde_json::to_value(payload)?,
            headers: BTreeMap::new(),
            downstream_key: None,
            ordering_key: None,
        })
    }

    /// Sets the downstream key instead of deriving it (required outside an idempotent request).
    pub fn with_downstream_key(mut self, key: impl Into<String>) -> Self {
        self.downstream_key = Some(key.into());
        self
    }

    /// Rows sharing an ordering key are delivered one at a time, in commit order.
    pub fn with_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Adds a header forwarded to the sink (for example `traceparent`).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Attaches the W3C trace context of the request that enqueues this message, so the trace
    /// reaches the effect: the relay records its trace id on the delivery span and HTTP sinks
    /// forward the header. Fails with [`Error::Invalid`] unless `traceparent` is a valid W3C
    /// `traceparent` value (garbage would be forwarded to every downstream).
    pub fn with_traceparent(mut self, traceparent: &str) -> Result<Self> {
        let parsed = crate::telemetry::Traceparent::parse(traceparent.trim())?;
        self.headers.insert(
            crate::telemetry::TRACEPARENT.to_owned(),
            parsed.as_str().to_owned(),
        );
        Ok(self)
    }

    /// Attaches the trace context of the current `tracing` span (as the OpenTelemetry layer
    /// exports it), when it has a valid one; the message is unchanged otherwise.
    #[cfg(feature = "otel")]
    pub fn with_current_trace(mut self) -> Self {
        if let Some(context) = crate::telemetry::current_traceparent() {
            self.headers.insert(
                crate::telemetry::TRACEPARENT.to_owned(),
                context.as_str().to_owned(),
            );
        }
        self
    }

    /// The message's `traceparent` header, if it carries one.
    pub fn traceparent(&self) -> Option<&str> {
        self.headers
            .get(crate::telemetry::TRACEPARENT)
            .map(String::as_str)
    }

    /// The message id (a UUIDv7, assigned at construction).
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The destination the relay routes this message to.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The downstream key, if one is set.
    pub fn downstream_key(&self) -> Option<&str> {
        self.downstream_key.as_deref()
    }

    /// The payload, as the row will store it and the sink will read it.
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }
}

/// Enqueues messages in the caller's transaction, outside any idempotent request (batch jobs,
/// consumers). Every message must carry a downstream key ([`OutboxMessage::with_downstream_key`];
/// [`crate::downstream_key::derive_downstream_key`] builds one from a job's own key). A (destination, downstream key)
/// already in the outbox is not enqueued again: the answer says which messages were written and
/// which were skipped ([`Enqueued`]).
pub async fn enqueue(mut tx: impl WriteTx, messages: &[OutboxMessage]) -> Result<Enqueued> {
    for message in messages {
        match &message.downstream_key {
            None => {
                return Err(Error::Invalid(format!(
                    "message {} to {:?} has no downstream key; outside an idempotent request \
                     set one with with_downstream_key",
                    message.id, message.destination
                )))
            }
            Some(key) => check_downstream_key(key)?,
        }
    }
    let rows = message_columns(messages.iter().map(|m| (m, m.downstream_key.clone())))?;
    lock_ordering_keys(&mut tx, &rows.ordering_keys).await?;
    let written = tx.insert_messages(&rows).await?;
    count_enqueued(&written.destinations);
    Ok(Enqueued::new(&rows.ids, &written.ids))
}

/// Counts the rows an insert wrote (a duplicate of a row already enqueued is not written), by
/// the destinations the insert returned.
pub(crate) fn count_enqueued(destinations: &[String]) {
    let mut by_destination: BTreeMap<&str, u64> = BTreeMap::new();
    for destination in destinations {
        *by_destination.entry(destination.as_str()).or_default() += 1;
    }
    for (destination, n) in by_destination {
        metrics::counter!(crate::telemetry::ENQUEUED, "destination" => destination.to_owned())
            .increment(n);
    }
}

/// Takes the ordering-key locks of a batch (no-op when no message has an ordering key).
pub(crate) async fn lock_ordering_keys(
    tx: &mut impl Statements,
    ordering_keys: &[Option<String>],
) -> Result<()> {
    let keys = self::ordering_keys(ordering_keys);
    if keys.is_empty() {
        return Ok(());
    }
    tx.lock_ordering_keys(&keys).await?;
    Ok(())
}

/// The ordering keys a batch carries.
fn ordering_keys(ordering_keys: &[Option<String>]) -> Vec<&str> {
    ordering_keys.iter().flatten().map(String::as_str).collect()
}

/// A batch of messages as column arrays, each with its downstream key, its names checked.
pub(crate) fn message_columns<'a>(
    messages: impl Iterator<Item = (&'a OutboxMessage, Option<String>)>,
) -> Result<MessageColumns> {
    let mut cols = MessageColumns {
        ids: Vec::new(),
        destinations: Vec::new(),
        payloads: Vec::new(),
        headers: Vec::new(),
        downstream_keys: Vec::new(),
        ordering_keys: Vec::new(),
    };
    for (message, key) in messages {
        let key = key.ok_or_else(|| Error::Invalid("a message has no downstream key".into()))?;
        if let Some(ordering) = &message.ordering_key {
            check_name("ordering key", ordering)?;
        }
        cols.ids.push(message.id);
        cols.destinations.push(message.destination.clone());
        cols.payloads.push(message.payload.clone());
        cols.headers.push(serde_json::to_value(&message.headers)?);
        cols.downstream_keys.push(key);
        cols.ordering_keys.push(message.ordering_key.clone());
    }
    Ok(cols)
}

/// Names (destinations, scopes, effects, ordering keys): 1..=255 bytes, no control characters.
pub(crate) fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(Error::Invalid(format!(
            "the {what} must be 1 to 255 bytes long, not {}",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::Invalid(format!(
            "the {what} {name:?} contains a control character"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enqueued_splits_written_from_skipped_in_the_order_given() {
        let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let enqueued = Enqueued::new(&[a, b, c], &[c, a]);
        assert_eq!(enqueued.written(), [a, c]);
        assert_eq!(enqueued.skipped(), [b]);
        assert!(!enqueued.all_written());
        assert!(Enqueued::new(&[a], &[a]).all_written());
    }

    #[test]
    fn payload_that_does_not_serialise_is_a_typed_error() {
        let mut map = std::collections::HashMap::new();
        map.insert((1, 2), "tuple keys are not JSON");
        assert!(matches!(
            OutboxMessage::new("email", &map),
            Err(Error::Payload(_))
        ));
    }

    #[test]
    fn empty_or_control_destination_is_rejected() {
        assert!(matches!(OutboxMessage::new("", &1), Err(Error::Invalid(_))));
        assert!(matches!(
            OutboxMessage::new("a\u{0}b", &1),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn ids_are_uuid_v7() {
        let m = OutboxMessage::new("email", &1).expect("valid");
        assert_eq!(m.id().get_version_num(), 7);
    }
}
