//! Reading the outbox without changing it: messages listed and shown with their history, failed
//! rows grouped by error, the last minutes' activity, and an idempotency key with what its
//! request enqueued.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use super::filter::FilterParams;
use super::{AdminError, ListCursor, MessageFilter, StoredJson};
use crate::state::{AttemptOutcome, MessageStatus};
use crate::store::admin as store;

/// A message as [`list_messages`] shows it (no payload: see [`show_message`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageSummary {
    /// The message id (UUIDv7).
    pub id: Uuid,
    /// Insertion order (commit order within an ordering key).
    pub seq: i64,
    /// The destination (the sink's name).
    pub destination: String,
    /// Where it is in its life.
    pub status: MessageStatus,
    /// The key forwarded downstream on every attempt.
    pub downstream_key: String,
    /// Its ordering key, if it has one.
    pub ordering_key: Option<String>,
    /// Attempts made since enqueue (or since the last replay).
    pub attempts: i32,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it is next due (pending rows only: no other row will be tried again; none for a
    /// row that waits for the row ahead).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// A pending row enqueued behind an earlier row of its ordering key, still there: it is due
    /// when that row leaves the hot table (delivered, discarded or purged), not at a time.
    pub waits_for_row_ahead: bool,
    /// When it was delivered (delivered rows only).
    pub delivered_at: Option<DateTime<Utc>>,
    /// The last failure's text (hot rows only).
    pub last_error: Option<String>,
    /// The relay holding (or that last held) its lease.
    pub lease_owner: Option<String>,
    /// When that lease ends.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When an operator discarded it (discarded rows only).
    pub discarded_at: Option<DateTime<Utc>>,
}

impl MessageSummary {
    /// Where this row is in [`list_messages`]' order: pass it as [`MessageFilter::before`] to
    /// list the rows after it.
    pub fn cursor(&self) -> ListCursor {
        ListCursor {
            created_at: self.created_at,
            seq: self.seq,
        }
    }
}

/// Everything about one message: [`show_message`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageDetail {
    /// The message's columns.
    #[serde(flatten)]
    pub message: MessageSummary,
    /// The payload, as enqueued (or its stored text, when it cannot be decoded).
    pub payload: StoredJson<serde_json::Value>,
    /// The headers forwarded to the sink (or their stored text, when they are not an object of
    /// strings).
    pub headers: StoredJson<BTreeMap<String, String>>,
    /// The downstream's receipt (delivered rows only).
    pub receipt: Option<String>,
    /// Every attempt and operator action, in the order they happened.
    pub history: Vec<AttemptRecord>,
}

/// One row of the attempt log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRecord {
    /// The row's attempt counter at this attempt (0 for an operator action).
    pub attempt: i32,
    /// The downstream key the attempt carried (after a replay: the key from then on).
    pub downstream_key: String,
    /// The relay that made the attempt, or `operator`.
    pub relay: String,
    /// The fencing token of the claim the attempt ran under.
    pub lease_token: Option<i64>,
    /// What the attempt came to, or what the operator did.
    pub outcome: AttemptOutcome,
    /// The error text (for a replay: what the operator changed, and who; for a discard: the
    /// reason, and who gave it).
    pub error: Option<String>,
    /// The downstream's receipt of a delivered attempt.
    pub receipt: Option<String>,
    /// When the attempt started.
    pub started_at: DateTime<Utc>,
    /// When its outcome was recorded.
    pub finished_at: DateTime<Utc>,
}

/// Lists the messages `filter` selects, hot, delivered and discarded alike, newest first; from
/// [`MessageFilter::before`] on when it is set (the next page: the last row's
/// [`MessageSummary::cursor`]).
///
/// ```
/// use txoutbox::admin::{list_messages, MessageFilter, MessageStatus};
///
/// # async fn run(client: &tokio_postgres::Client) -> Result<(), txoutbox::admin::AdminError> {
/// // The dead letters of the email sink, 50 a page.
/// let mut filter = MessageFilter {
///     status: Some(MessageStatus::Failed),
///     destination: Some("email".into()),
///     limit: Some(50),
///     ..MessageFilter::default()
/// };
/// loop {
///     let page = list_messages(client, &filter).await?;
///     for row in &page {
///         println!("{} {:?} {}", row.id, row.last_error, row.attempts);
///     }
///     match page.last() {
///         Some(last) if page.len() == 50 => filter.before = Some(last.cursor()),
///         _ => break,
///     }
/// }
/// # Ok(())
/// # }
/// # txoutbox_test_support::doc_test(|mut client| async move {
/// #     txoutbox_test_support::factory::message(&mut client).destination("email")
/// #         .status(MessageStatus::Failed).create_many(120).await?;
/// #     run(&client).await?;
/// #     Ok(())
/// # });
/// ```
pub async fn list_messages(
    client: &impl GenericClient,
    filter: &MessageFilter,
) -> Result<Vec<MessageSummary>, AdminError> {
    store::inspect::list(client, filter.status, &FilterParams::new(filter)?).await
}

/// One message with its payload, headers, receipt and full attempt history.
///
/// ```
/// # async fn run(client: &tokio_postgres::Client, id: uuid::Uuid)
/// #     -> Result<(), txoutbox::admin::AdminError> {
/// let detail = txoutbox::admin::show_message(client, id).await?;
/// println!("{} to {}: {:?}", detail.message.id, detail.message.destination, detail.message.status);
/// for attempt in &detail.history {
///     println!("  {attempt:?}");
/// }
/// # Ok(())
/// # }
/// # txoutbox_test_support::doc_test(|mut client| async move {
/// #     let id = txoutbox_test_support::factory::message(&mut client).create().await?;
/// #     run(&client, id).await?;
/// #     Ok(())
/// # });
/// ```
pub async fn show_message(
    client: &impl GenericClient,
    id: Uuid,
) -> Result<MessageDetail, AdminError> {
    let shown = store::inspect::show(client, id)
        .await?
        .ok_or(AdminError::NotFound(id))?;
    let history = store::inspect::history(client, id).await?;
    Ok(MessageDetail {
        message: shown.message,
        payload: StoredJson::decode(shown.payload),
        headers: StoredJson::decode(shown.headers),
        receipt: shown.receipt,
        history,
    })
}

/// Failed (or unknown) rows of one destination whose errors are the same once normalised:
/// [`failure_groups`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailureGroup {
    /// `failed` (dead-lettered) or `unknown` (an at-most-once attempt whose outcome was lost:
    /// an operator decides whether it happened).
    pub status: MessageStatus,
    /// The destination.
    pub destination: String,
    /// The normalised error text (UUIDs as `<uuid>`, email addresses as `<email>`, timestamps as
    /// `<time>`, standalone numbers as `<n>` but status codes 100 to 599 kept, long words mixing
    /// digits and letters as `<id>`; host names, addresses and ports kept; `""` without an
    /// error): the [`MessageFilter::error_class`] that selects the group.
    pub error: String,
    /// One of the group's original texts.
    pub example: Option<String>,
    /// Rows in the group.
    pub count: u64,
    /// The earliest failure (a row's last attempt).
    pub first_seen: DateTime<Utc>,
    /// The latest failure.
    pub last_seen: DateTime<Utc>,
}

/// Failed and unknown rows grouped by state, destination and normalised error text: the unknown
/// groups first (they need an operator's decision), then the largest, at most `limit` groups.
pub async fn failure_groups(
    client: &impl GenericClient,
    limit: u64,
) -> Result<Vec<FailureGroup>, AdminError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    store::inspect::failure_groups(client, limit).await
}

/// One minute (or one bucket of [`activity_buckets`]) of the outbox's recent life: [`activity`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MinuteActivity {
    /// The minute's (the bucket's) start.
    pub minute: DateTime<Utc>,
    /// Rows delivered in it.
    pub delivered: u64,
    /// Relay attempts that failed in it (`retry`, `failed`, `expired`, `unknown`).
    pub failed: u64,
    /// Delivery latency (enqueue to delivery) of its deliveries, median, in seconds.
    pub latency_p50: Option<f64>,
    /// The same at the 99th percentile.
    pub latency_p99: Option<f64>,
}

/// The last `minutes` minutes (this one included), oldest first, one entry each.
pub async fn activity(
    client: &impl GenericClient,
    minutes: u32,
) -> Result<Vec<MinuteActivity>, AdminError> {
    let minutes = i32::try_from(minutes.clamp(1, 24 * 60)).unwrap_or(60);
    store::inspect::activity(client, minutes, 60.0).await
}

/// The last `buckets` buckets of `width` each (the current one included, each starting at a
/// multiple of `width` since the epoch, UTC), oldest first: the 24 h and 7 d views (96 buckets of
/// 15 min, 168 of 1 h). At most 1 440 buckets, each from 1 min to 1 day wide (clamped).
pub async fn activity_buckets(
    client: &impl GenericClient,
    buckets: u32,
    width: std::time::Duration,
) -> Result<Vec<MinuteActivity>, AdminError> {
    let buckets = i32::try_from(buckets.clamp(1, 24 * 60)).unwrap_or(60);
    let width = width.as_secs().clamp(60, 24 * 60 * 60) as f64;
    store::inspect::activity(client, buckets, width).await
}

/// One idempotency key as stored: [`lookup_key`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IdempotencyRecord {
    /// The key's scope.
    pub scope: String,
    /// The client's key.
    pub key: String,
    /// The request fingerprint, hex.
    pub fingerprint: String,
    /// `in_flight` or `completed`.
    pub state: String,
    /// The stored response's status (completed keys).
    pub response_status: Option<u16>,
    /// Its headers, in order (none for a key without a response), or their stored text when
    /// they are not a JSON array of [name, value] pairs.
    pub response_headers: StoredJson<Vec<(String, String)>>,
    /// Its body bytes.
    pub response_body: Option<Vec<u8>>,
    /// When the request claimed the key.
    pub claimed_at: DateTime<Utc>,
    /// When its window ends.
    pub expires_at: DateTime<Utc>,
    /// True when the window has passed (the key is new again for the next request).
    pub expired: bool,
}

/// A key and what its request enqueued: [`lookup_key`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyLookup {
    /// The key row.
    pub record: IdempotencyRecord,
    /// The messages the request enqueued, oldest first, in whichever state they are now.
    pub messages: Vec<MessageSummary>,
}

/// Looks up (scope, key) and the messages its request enqueued: those written by the claim's
/// transaction (same `created_at`, the transaction's time; a message of another transaction that
/// started in the same microsecond would be listed too) and those whose downstream key is the one
/// the claim derives for one of `effects` ([`crate::idempotency::Claim::downstream_key`]). `None` when no such
/// key is stored (never used, or pruned).
pub async fn lookup_key(
    client: &impl GenericClient,
    scope: &str,
    key: &str,
    effects: &[String],
) -> Result<Option<KeyLookup>, AdminError> {
    let Some(row) = store::inspect::key(client, scope, key).await? else {
        return Ok(None);
    };
    let record = IdempotencyRecord {
        scope: row.scope,
        key: row.key,
        fingerprint: row.fingerprint.iter().map(|b| format!("{b:02x}")).collect(),
        state: row.state,
        response_status: row.response_status.and_then(|s| u16::try_from(s).ok()),
        response_headers: row
            .response_headers
            .map_or(StoredJson::Decoded(Vec::new()), StoredJson::decode),
        response_body: row.response_body,
        claimed_at: row.claimed_at,
        expires_at: row.expires_at,
        expired: row.expired,
    };
    let derived: Vec<String> = match crate::key::IdempotencyKey::parse(key) {
        Ok(parsed) => effects
            .iter()
            .map(|effect| {
                crate::downstream_key::derive_claim_downstream_key(
                    scope,
                    &parsed,
                    row.claimed_micros,
                    effect,
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let messages = store::inspect::key_messages(client, &record.claimed_at, &derived).await?;
    Ok(Some(KeyLookup { record, messages }))
}

/// One inbox record as stored: [`lookup_inbox`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InboxRecord {
    /// The receiving consumer.
    pub consumer: String,
    /// The sender's message id.
    pub message_id: String,
    /// When the message was first received.
    pub received_at: DateTime<Utc>,
    /// When the record's window ends.
    pub expires_at: DateTime<Utc>,
    /// `processed`, or `failed` (the consumer gave the message up; `error` says why).
    pub outcome: String,
    /// Why the consumer gave the message up.
    pub error: Option<String>,
    /// True when the window has passed (the next delivery of the message is new).
    pub expired: bool,
}

/// An inbox record and what its message's handler enqueued: [`lookup_inbox`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InboxLookup {
    /// The record.
    pub record: InboxRecord,
    /// The messages the handler enqueued, oldest first, in whichever state they are now.
    pub messages: Vec<MessageSummary>,
}

/// Looks up the inbox record of (consumer, message id) and the messages its handler enqueued:
/// those written by the receiving transaction (same `created_at`, the transaction's time) and
/// those whose downstream key is the one derived for one of `effects`
/// ([`crate::inbox::derive_inbox_downstream_key`]). `None` when there is no record (never
/// received, or pruned).
pub async fn lookup_inbox(
    client: &impl GenericClient,
    consumer: &str,
    message_id: &str,
    effects: &[String],
) -> Result<Option<InboxLookup>, AdminError> {
    let Some(record) = store::inspect::inbox_record(client, consumer, message_id).await? else {
        return Ok(None);
    };
    let derived: Vec<String> = effects
        .iter()
        .map(|effect| crate::inbox::derive_inbox_downstream_key(consumer, message_id, effect))
        .collect();
    let messages = store::inspect::key_messages(client, &record.received_at, &derived).await?;
    Ok(Some(InboxLookup { record, messages }))
}
