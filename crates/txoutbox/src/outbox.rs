//! Outbox messages: the downstream effects a transaction enqueues, and their downstream keys.

use std::collections::BTreeMap;

use serde::Serialize;
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::{sql, Error, IdempotencyKey, Result, TxExecutor};

/// The namespace of derived downstream keys (a fixed UUID of this project).
pub const DOWNSTREAM_KEY_NAMESPACE: Uuid =
    Uuid::from_u128(0x6a1f_3c2e_8b4d_4e7a_9c15_2f0b_7d3e_91a4);

/// Derives a downstream key from a key of the caller's own (a batch job's run id, say):
/// `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "{scope}\n{key}\n{effect}")`, as a hyphenated lower-case UUID.
///
/// The same (scope, key, effect) always gives the same key, on every host and every version;
/// two effects give two keys. Effects enqueued on a [`crate::Claim`] get keys that also depend on
/// the claim, so that a key reused after its window makes new effects
/// ([`crate::Claim::downstream_key`] tells them). Scope and effect names contain no newline (they are
/// validated) and keys are visible ASCII, so the joined name is unambiguous.
pub fn derive_downstream_key(scope: &str, key: &IdempotencyKey, effect: &str) -> String {
    let name = format!("{scope}\n{}\n{effect}", key.as_str());
    Uuid::new_v5(&DOWNSTREAM_KEY_NAMESPACE, name.as_bytes()).to_string()
}

/// The downstream key of one effect of one claim of a request's key:
/// `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "{scope}\n{key}\n{effect}\n{claimed_at}")`, where
/// `claimed_at` is the claim's time in microseconds since the Unix epoch (the key row's
/// `created_at`), in decimal.
///
/// Every attempt of the effect carries the key stored with its row, so retries and redeliveries
/// within the key's window carry the same key. A request with the same key after the window is a
/// new claim with a new time, so its effects get new keys: they are new effects, and the outbox
/// (which deduplicates on the key) and the downstream (which would answer the old effect) must
/// not take them for the old ones.
pub(crate) fn derive_claim_downstream_key(
    scope: &str,
    key: &IdempotencyKey,
    claimed_at_micros: i64,
    effect: &str,
) -> String {
    let name = format!("{scope}\n{}\n{effect}\n{claimed_at_micros}", key.as_str());
    Uuid::new_v5(&DOWNSTREAM_KEY_NAMESPACE, name.as_bytes()).to_string()
}

/// What one enqueue wrote ([`enqueue`], [`crate::Claim::complete`]), by message id
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
        let parsed = crate::Traceparent::parse(traceparent.trim())?;
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
}

/// Enqueues messages in the caller's transaction, outside any idempotent request (batch jobs,
/// consumers). Every message must carry a downstream key ([`OutboxMessage::with_downstream_key`];
/// [`derive_downstream_key`] builds one from a job's own key). A (destination, downstream key)
/// already in the outbox is not enqueued again: the answer says which messages were written and
/// which were skipped ([`Enqueued`]).
pub async fn enqueue(tx: &impl TxExecutor, messages: &[OutboxMessage]) -> Result<Enqueued> {
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
    let rows = MessageColumns::new(messages.iter().map(|m| (m, m.downstream_key.clone())))?;
    lock_ordering_keys(tx, &rows.ordering_keys).await?;
    let inserted = tx
        .rows(
            sql::messages::INSERT,
            &[
                (&rows.ids, Type::UUID_ARRAY),
                (&rows.destinations, Type::TEXT_ARRAY),
                (&rows.payloads, Type::JSONB_ARRAY),
                (&rows.headers, Type::JSONB_ARRAY),
                (&rows.downstream_keys, Type::TEXT_ARRAY),
                (&rows.ordering_keys, Type::TEXT_ARRAY),
            ],
        )
        .await?;
    let mut ids = Vec::with_capacity(inserted.len());
    let mut destinations = Vec::with_capacity(inserted.len());
    for row in &inserted {
        ids.push(row.try_get::<_, Uuid>(0)?);
        destinations.push(row.try_get::<_, String>(1)?);
    }
    count_enqueued(&destinations);
    Ok(Enqueued::new(&rows.ids, &ids))
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
    tx: &impl TxExecutor,
    ordering_keys: &[Option<String>],
) -> Result<()> {
    let keys: Vec<&str> = ordering_keys.iter().flatten().map(String::as_str).collect();
    if keys.is_empty() {
        return Ok(());
    }
    tx.rows(
        sql::messages::LOCK_ORDERING_KEYS,
        &[(&keys, Type::TEXT_ARRAY)],
    )
    .await?;
    Ok(())
}

/// A batch of messages as column arrays, ready for one `unnest` insert.
pub(crate) struct MessageColumns {
    pub(crate) ids: Vec<Uuid>,
    pub(crate) destinations: Vec<String>,
    pub(crate) payloads: Vec<serde_json::Value>,
    pub(crate) headers: Vec<serde_json::Value>,
    pub(crate) downstream_keys: Vec<String>,
    pub(crate) ordering_keys: Vec<Option<String>>,
}

impl MessageColumns {
    pub(crate) fn new<'a>(
        messages: impl Iterator<Item = (&'a OutboxMessage, Option<String>)>,
    ) -> Result<Self> {
        let mut cols = MessageColumns {
            ids: Vec::new(),
            destinations: Vec::new(),
            payloads: Vec::new(),
            headers: Vec::new(),
            downstream_keys: Vec::new(),
            ordering_keys: Vec::new(),
        };
        for (message, key) in messages {
            let key =
                key.ok_or_else(|| Error::Invalid("a message has no downstream key".into()))?;
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

/// Downstream keys are forwarded as HTTP headers and Message-IDs: the key alphabet applies.
pub(crate) fn check_downstream_key(key: &str) -> Result<()> {
    IdempotencyKey::parse(key)
        .map(|_| ())
        .map_err(|e| Error::Invalid(format!("downstream key: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_are_deterministic_and_distinct_per_effect() {
        let key = IdempotencyKey::parse("k-1").expect("valid");
        let a = derive_downstream_key("charges", &key, "stripe");
        assert_eq!(a, derive_downstream_key("charges", &key, "stripe"));
        assert_ne!(a, derive_downstream_key("charges", &key, "email"));
        assert_ne!(a, derive_downstream_key("refunds", &key, "stripe"));
        // The documented rule, spelled out.
        let expected = Uuid::new_v5(&DOWNSTREAM_KEY_NAMESPACE, b"charges\nk-1\nstripe").to_string();
        assert_eq!(a, expected);
    }

    #[test]
    fn claim_keys_differ_per_claim_time_and_follow_the_documented_rule() {
        let key = IdempotencyKey::parse("k-1").expect("valid");
        let first = derive_claim_downstream_key("charges", &key, 1_764_000_000_000_001, "stripe");
        let later = derive_claim_downstream_key("charges", &key, 1_764_086_400_000_002, "stripe");
        assert_ne!(first, later, "a new claim of the key gets new keys");
        assert_ne!(
            first,
            derive_claim_downstream_key("charges", &key, 1_764_000_000_000_001, "email")
        );
        let expected = Uuid::new_v5(
            &DOWNSTREAM_KEY_NAMESPACE,
            b"charges\nk-1\nstripe\n1764000000000001",
        )
        .to_string();
        assert_eq!(first, expected);
    }

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
