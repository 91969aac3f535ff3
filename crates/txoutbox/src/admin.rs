//! The operator's tools: list, show, replay, discard, purge and stats. The `txoutbox` command is a thin
//! shell over these functions, so a service (an admin endpoint, a scheduled purge) runs the same
//! code.
//!
//! States are the relay's: `pending`, `in_flight`, `failed` and `unknown` rows live in
//! `txoutbox_messages`; `delivered` rows were moved to `txoutbox_delivered` by the relay,
//! `discarded` ones to `txoutbox_discarded` by an operator's [`discard`].
//!
//! # Discard rules
//!
//! - A discarded row is closed without delivery: it leaves the hot table for
//!   `txoutbox_discarded`, with an attempt-log row (attempt 0, relay `operator`, outcome
//!   `discarded`, the operator's reason as its text, followed by `(by operator {name})` when
//!   [`DiscardOptions::operator`] names them). The next row of its ordering key is due at once: a
//!   dead-lettered head no longer blocks its key.
//! - Only `failed` and `unknown` rows are discarded. By ids, anything else refuses the whole
//!   discard and nothing changes (as for a replay); by filter, the statuses are the filter's when
//!   it is `failed` or `unknown`, else `failed`.
//! - A discarded row is not replayed (the effect can be enqueued again: its (destination, key)
//!   is free once the row left the hot table).
//!
//! # Replay rules
//!
//! - **By ids**, each id must name a `failed` or `unknown` row, or a `delivered` one when
//!   [`ReplayOptions::include_delivered`] is set. Naming an `unknown` row (an at-most-once attempt
//!   whose outcome was lost) is the operator's explicit decision that it did not happen. Anything
//!   else refuses the whole replay, and nothing changes: an unknown id ([`AdminError::NotFound`]),
//!   a row a relay holds under a live lease ([`AdminError::Leased`]), a `pending` row or an
//!   `in_flight` one whose lease ran out ([`AdminError::NotReplayable`]).
//! - **By filter**, the statuses replayed are the filter's status when it is `failed` or
//!   `unknown` (`unknown` rows are replayed only when asked for by name), else `failed`;
//!   `include_delivered` adds `delivered` rows. Rows that change state while the replay runs are
//!   skipped and reported.
//! - A replayed row is `pending`, due now, with 0 attempts, no lease and no last error, and keeps
//!   its downstream key, unless [`ReplayOptions::new_key`] asks for [`replay_downstream_key`]. A
//!   delivered row moves back to `txoutbox_messages`. Every replayed row gets an attempt-log row
//!   (attempt 0, relay `operator`, outcome `replayed`, the key it carries, and a note naming the old
//!   key when it changed).
//! - Rows are locked (`FOR UPDATE`) and checked in the transaction that changes them, so a relay
//!   cannot claim or complete one halfway: its claim skips locked rows, its completion waits.

mod flow;
mod sql;

pub use flow::{destination_flows, pause_destination, resume_destination, DestinationFlow};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, Row, Transaction};
use uuid::Uuid;

use crate::outbox::lock_ordering_keys;
use crate::{Error, DOWNSTREAM_KEY_NAMESPACE};

/// How long delivered rows are kept by default: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How long failed, unknown and discarded rows are kept by default: 90 days (an operator decides
/// about them, or decided, and may need to look back).
pub const DEFAULT_FAILED_RETENTION: Duration = Duration::from_secs(90 * 24 * 60 * 60);

/// Up to this many delivered rows, [`stats`] counts them exactly (reading at most this many index
/// entries); above, it reports the planner's estimate, marked as such.
pub const EXACT_DELIVERED_COUNT_MAX: i64 = 10_000;

/// Up to this many hot rows (pending, in flight, failed, unknown), [`stats`] counts them exactly
/// (reading at most this many rows); above, it reports counts from a sample, marked as such.
pub const EXACT_HOT_COUNT_MAX: i64 = 100_000;

/// How many rows a replay by filter changes per transaction by default.
pub const DEFAULT_REPLAY_BATCH: usize = 500;

/// The window of [`OutboxStats`]'s failure rate: the last hour.
pub const FAILURE_RATE_WINDOW: Duration = Duration::from_secs(60 * 60);

/// Where a message is in its life. The names are the `status` column's values; `delivered` rows
/// are those the relay moved to `txoutbox_delivered`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Waiting for delivery (due at `next_attempt_at`).
    Pending,
    /// Leased by a relay that is delivering it.
    InFlight,
    /// Dead-lettered: a permanent failure or too many attempts. Waits for an operator.
    Failed,
    /// An at-most-once attempt whose outcome was lost: it may or may not have happened.
    Unknown,
    /// Delivered (kept in `txoutbox_delivered` until the retention passes).
    Delivered,
    /// Closed by an operator without delivery (kept in `txoutbox_discarded`).
    Discarded,
}

impl MessageStatus {
    /// Every status, in the order of a message's life.
    pub const ALL: [MessageStatus; 6] = [
        MessageStatus::Pending,
        MessageStatus::InFlight,
        MessageStatus::Failed,
        MessageStatus::Unknown,
        MessageStatus::Delivered,
        MessageStatus::Discarded,
    ];

    /// The column value (`in_flight`, not `in-flight`).
    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Pending => "pending",
            MessageStatus::InFlight => "in_flight",
            MessageStatus::Failed => "failed",
            MessageStatus::Unknown => "unknown",
            MessageStatus::Delivered => "delivered",
            MessageStatus::Discarded => "discarded",
        }
    }
}

impl fmt::Display for MessageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MessageStatus {
    type Err = AdminError;

    /// Parses a column value; `in-flight` is accepted for `in_flight`.
    fn from_str(s: &str) -> Result<Self, AdminError> {
        match s {
            "pending" => Ok(MessageStatus::Pending),
            "in_flight" | "in-flight" => Ok(MessageStatus::InFlight),
            "failed" => Ok(MessageStatus::Failed),
            "unknown" => Ok(MessageStatus::Unknown),
            "delivered" => Ok(MessageStatus::Delivered),
            "discarded" => Ok(MessageStatus::Discarded),
            other => Err(AdminError::Invalid(format!(
                "{other:?} is not a status (pending, in_flight, failed, unknown, delivered, \
                 discarded)"
            ))),
        }
    }
}

/// One end of a time range, compared with a message's enqueue time (`created_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBound {
    /// A point in time.
    At(DateTime<Utc>),
    /// This long before now, by the database's clock (the one that wrote `created_at`).
    Ago(Duration),
}

/// Which messages to list or replay. Every field narrows the selection; the default selects all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageFilter {
    /// Only messages in this state.
    pub status: Option<MessageStatus>,
    /// Only messages to this destination (the sink's name).
    pub destination: Option<String>,
    /// Only messages enqueued at or after this.
    pub since: Option<TimeBound>,
    /// Only messages enqueued before this.
    pub until: Option<TimeBound>,
    /// Only the message(s) carrying this downstream key.
    pub downstream_key: Option<String>,
    /// Only messages of this ordering key.
    pub ordering_key: Option<String>,
    /// Only hot messages whose last error contains this text (ignoring case).
    pub error_contains: Option<String>,
    /// Only hot messages whose last error, normalised, is this text: a group of
    /// [`failure_groups`] ([`FailureGroup::error`]; `""` for rows without an error).
    pub error_class: Option<String>,
    /// Only messages listed after this one in [`list_messages`]' order (newest first): the next
    /// page of a keyset pagination, stable while rows are inserted.
    pub before: Option<ListCursor>,
    /// At most this many messages (`None`: all).
    pub limit: Option<u64>,
}

/// A place in [`list_messages`]' order (`created_at`, then `seq`, both descending): the page
/// after it starts with the next older message. [`MessageSummary::cursor`] gives a row's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListCursor {
    /// The enqueue time of the last message seen.
    pub created_at: DateTime<Utc>,
    /// Its `seq`.
    pub seq: i64,
}

impl fmt::Display for ListCursor {
    /// `{created_at in microseconds since the epoch}.{seq}`, the form [`FromStr`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.created_at.timestamp_micros(), self.seq)
    }
}

impl FromStr for ListCursor {
    type Err = AdminError;

    fn from_str(s: &str) -> Result<Self, AdminError> {
        let invalid = || AdminError::Invalid(format!("{s:?} is not a list cursor"));
        let (micros, seq) = s.split_once('.').ok_or_else(invalid)?;
        let micros: i64 = micros.parse().map_err(|_| invalid())?;
        Ok(ListCursor {
            created_at: DateTime::from_timestamp_micros(micros).ok_or_else(invalid)?,
            seq: seq.parse().map_err(|_| invalid())?,
        })
    }
}

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
    /// When it is next due (hot rows only).
    pub next_attempt_at: Option<DateTime<Utc>>,
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
    /// The payload, as enqueued.
    pub payload: serde_json::Value,
    /// The headers forwarded to the sink.
    pub headers: BTreeMap<String, String>,
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
    /// `delivered`, `retry`, `failed`, `expired`, `unknown`, `lease_lost`, `released`,
    /// `replayed` or `discarded`.
    pub outcome: String,
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

/// What a replay or a discard acts on.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplaySelection {
    /// These messages, all or none (see the module's replay rules).
    Ids(Vec<Uuid>),
    /// The replayable messages this filter selects.
    Filter(MessageFilter),
}

/// How to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Replay delivered rows too (the effect is sent again).
    pub include_delivered: bool,
    /// Give each row a fresh downstream key ([`replay_downstream_key`]): for a downstream that
    /// remembers the old key's answer (a cached permanent error).
    pub new_key: bool,
    /// Change nothing; report what would be replayed.
    pub dry_run: bool,
    /// Refuse with [`AdminError::TooMany`], changing nothing, when more rows than this are
    /// selected (`None`: no bound). The command uses it for "confirm with --yes".
    pub max_rows: Option<u64>,
    /// Rows per transaction of a replay by filter (default 500).
    pub batch_size: usize,
    /// Who asked for the replay (a dashboard user, say), named in each row's attempt-log note.
    pub operator: Option<String>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            include_delivered: false,
            new_key: false,
            dry_run: false,
            max_rows: None,
            batch_size: DEFAULT_REPLAY_BATCH,
            operator: None,
        }
    }
}

/// A message put back to pending (or that would be, in a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayedMessage {
    /// The message id.
    pub id: Uuid,
    /// Its destination.
    pub destination: String,
    /// Its status before the replay.
    pub from: MessageStatus,
    /// The downstream key it is delivered with from now on.
    pub downstream_key: String,
    /// The key it carried before, when the replay gave it a new one.
    pub replaced_key: Option<String>,
}

/// A message a replay by filter selected but left alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedMessage {
    /// The message id.
    pub id: Uuid,
    /// Why (it changed state since it was selected, or its key is taken).
    pub reason: String,
}

/// What a replay did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ReplayReport {
    /// True when nothing was changed.
    pub dry_run: bool,
    /// The rows replayed, in selection order.
    pub replayed: Vec<ReplayedMessage>,
    /// The rows left alone, with the reason.
    pub skipped: Vec<SkippedMessage>,
}

/// How long rows are kept, by state. A row's age is its delivery or discard time; for a failed
/// or unknown row (still in the hot table), its last attempt-log entry's (else its enqueue time).
/// Attempt-log rows go with their message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Delivered rows (default 7 days).
    pub delivered: Duration,
    /// Failed (dead-lettered) rows (default 90 days).
    pub failed: Duration,
    /// Unknown rows (default 90 days).
    pub unknown: Duration,
    /// Discarded rows (default 90 days).
    pub discarded: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            delivered: DEFAULT_RETENTION,
            failed: DEFAULT_FAILED_RETENTION,
            unknown: DEFAULT_FAILED_RETENTION,
            discarded: DEFAULT_FAILED_RETENTION,
        }
    }
}

/// How to discard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscardOptions {
    /// Why the rows are closed without delivery: kept in the attempt log (outcome `discarded`)
    /// and on the discarded row. Must not be blank.
    pub reason: String,
    /// Change nothing; report what would be discarded.
    pub dry_run: bool,
    /// Refuse with [`AdminError::TooMany`], changing nothing, when more rows than this are
    /// selected (`None`: no bound).
    pub max_rows: Option<u64>,
    /// Rows per transaction of a discard by filter (default 500).
    pub batch_size: usize,
    /// Who asked for the discard (a dashboard user, say), named in each row's attempt-log text
    /// after the reason. The discarded row keeps the reason alone.
    pub operator: Option<String>,
}

impl DiscardOptions {
    /// Options for a discard with this reason (no dry run, no bound, batches of 500, no operator
    /// named).
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            dry_run: false,
            max_rows: None,
            batch_size: DEFAULT_REPLAY_BATCH,
            operator: None,
        }
    }
}

/// A message closed without delivery (or that would be, in a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiscardedMessage {
    /// The message id.
    pub id: Uuid,
    /// Its destination.
    pub destination: String,
    /// Its status before the discard (`failed` or `unknown`).
    pub from: MessageStatus,
    /// Its ordering key: the next row of this key is due at once.
    pub ordering_key: Option<String>,
}

/// What a discard did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct DiscardReport {
    /// True when nothing was changed.
    pub dry_run: bool,
    /// The rows discarded, in selection order.
    pub discarded: Vec<DiscardedMessage>,
    /// The rows a discard by filter left alone, with the reason.
    pub skipped: Vec<SkippedMessage>,
}

/// How to purge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeOptions {
    /// How long rows are kept, by state (7 days delivered, 90 days the others).
    pub retention: Retention,
    /// Rows per batch, each batch its own transaction (default 1000).
    pub batch: i64,
    /// Also delete idempotency keys whose own window has passed (default true). Keys are never
    /// deleted by `retention`: their window is the retry contract published to clients.
    pub expired_keys: bool,
    /// Change nothing; count what would be deleted.
    pub dry_run: bool,
}

impl Default for PurgeOptions {
    fn default() -> Self {
        Self {
            retention: Retention::default(),
            batch: crate::DEFAULT_PRUNE_BATCH,
            expired_keys: true,
            dry_run: false,
        }
    }
}

/// What a purge deleted (or, in a dry run, would delete).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgeReport {
    /// True when nothing was changed.
    pub dry_run: bool,
    /// Rows delivered before this were purged.
    pub cutoff: DateTime<Utc>,
    /// Delivered rows deleted.
    pub delivered: u64,
    /// Failed rows deleted (idle since before their retention).
    pub failed: u64,
    /// Unknown rows deleted.
    pub unknown: u64,
    /// Discarded rows deleted.
    pub discarded: u64,
    /// Attempt-log rows deleted (of the purged rows, and older orphans).
    pub attempts: u64,
    /// Expired idempotency keys deleted.
    pub expired_keys: u64,
}

/// Rows in each state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct StatusCounts {
    /// Waiting for delivery.
    pub pending: u64,
    /// Being delivered.
    pub in_flight: u64,
    /// Dead-lettered.
    pub failed: u64,
    /// Outcome lost (at-most-once).
    pub unknown: u64,
    /// Delivered and not yet purged (an estimate when [`OutboxStats::delivered_estimated`]).
    pub delivered: u64,
    /// Discarded by an operator and not yet purged.
    pub discarded: u64,
}

impl StatusCounts {
    fn add(&mut self, status: MessageStatus, n: u64) {
        match status {
            MessageStatus::Pending => self.pending += n,
            MessageStatus::InFlight => self.in_flight += n,
            MessageStatus::Failed => self.failed += n,
            MessageStatus::Unknown => self.unknown += n,
            MessageStatus::Delivered => self.delivered += n,
            MessageStatus::Discarded => self.discarded += n,
        }
    }

    /// The count of one state.
    pub fn get(&self, status: MessageStatus) -> u64 {
        match status {
            MessageStatus::Pending => self.pending,
            MessageStatus::InFlight => self.in_flight,
            MessageStatus::Failed => self.failed,
            MessageStatus::Unknown => self.unknown,
            MessageStatus::Delivered => self.delivered,
            MessageStatus::Discarded => self.discarded,
        }
    }
}

/// Relay attempts over [`FAILURE_RATE_WINDOW`] and how many of them failed (`retry`, `failed`,
/// `expired`, `unknown`; a `delivered` attempt succeeded).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct FailureRate {
    /// Attempts with an outcome.
    pub attempts: u64,
    /// Of which failed.
    pub failures: u64,
    /// failures / attempts (`None` without attempts).
    pub rate: Option<f64>,
}

impl FailureRate {
    fn new(attempts: u64, failures: u64) -> Self {
        Self {
            attempts,
            failures,
            rate: (attempts > 0).then(|| failures as f64 / attempts as f64),
        }
    }
}

/// One destination's numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DestinationStats {
    /// The destination.
    pub destination: String,
    /// Its rows by state.
    #[serde(flatten)]
    pub counts: StatusCounts,
    /// How long ago its oldest pending row was enqueued.
    #[serde(serialize_with = "secs")]
    pub oldest_pending_age: Option<Duration>,
    /// Its attempts' failure rate over the last hour.
    pub last_hour: FailureRate,
}

/// The outbox at a glance: [`stats`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxStats {
    /// By destination, in name order.
    pub destinations: Vec<DestinationStats>,
    /// All destinations together.
    pub total: StatusCounts,
    /// How long ago the oldest pending row was enqueued.
    #[serde(serialize_with = "secs")]
    pub oldest_pending_age: Option<Duration>,
    /// The failure rate of all attempts over the last hour.
    pub last_hour: FailureRate,
    /// True when the delivered counts are the planner's estimate (`pg_class.reltuples` and
    /// `pg_stats`, as of the last ANALYZE), not a count: the history holds more than
    /// [`EXACT_DELIVERED_COUNT_MAX`] rows, and counting them would scan it.
    pub delivered_estimated: bool,
    /// True when the pending counts and the per-destination oldest pending ages come from a
    /// sample of the hot table, scaled to its size: the backlog holds more than
    /// [`EXACT_HOT_COUNT_MAX`] rows, and counting them at each look would scan it. In-flight,
    /// failed and unknown rows are still counted exactly (their partial indexes are small), and
    /// [`OutboxStats::oldest_pending_age`] stays exact.
    pub hot_estimated: bool,
    /// The destinations flow control holds back or counts something for (paused, a breaker not
    /// closed or counting failures, a rate limit), by name.
    pub flow: Vec<DestinationFlow>,
}

/// Why an operator's action was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No message has this id (in the hot table or the delivered history).
    #[error("no outbox message has id {0}")]
    NotFound(Uuid),
    /// A relay is delivering the message right now; replaying it would race the attempt.
    #[error(
        "message {id} is being delivered by relay {owner} (its lease runs until {}); \
         wait for the attempt to finish",
        .expires_at.to_rfc3339_opts(SecondsFormat::Secs, true)
    )]
    Leased {
        /// The message.
        id: Uuid,
        /// The relay holding the lease.
        owner: String,
        /// When the lease ends.
        expires_at: DateTime<Utc>,
    },
    /// The message is in a state that a replay does not change (the reason says what to do).
    #[error("message {id} is {status}: {reason}")]
    NotReplayable {
        /// The message.
        id: Uuid,
        /// Its state.
        status: MessageStatus,
        /// Why it is not replayed.
        reason: String,
    },
    /// A delivered message cannot go back with its key: the same effect was enqueued again and
    /// waits in the hot table under that key. Replay with a new key, or let the other row go.
    #[error(
        "message {id} cannot be replayed with its downstream key {downstream_key}: message \
         {other} to the same destination carries it already (replay with a new key instead)"
    )]
    KeyConflict {
        /// The delivered message.
        id: Uuid,
        /// The hot message carrying the key.
        other: Uuid,
        /// The key.
        downstream_key: String,
    },
    /// More rows were selected than the caller allowed; nothing was changed.
    #[error("{count} messages are selected, more than the {max} allowed without confirmation")]
    TooMany {
        /// Rows selected.
        count: u64,
        /// The bound given.
        max: u64,
    },
    /// The selection or the options contradict each other.
    #[error("invalid selection: {0}")]
    Invalid(String),
    /// Postgres could not be reached or answered with an error.
    #[error(transparent)]
    Store(#[from] Error),
}

impl AdminError {
    /// True when the store could not be reached: nothing was decided, try again later.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, AdminError::Store(e) if e.is_unavailable())
    }
}

impl From<tokio_postgres::Error> for AdminError {
    fn from(err: tokio_postgres::Error) -> Self {
        AdminError::Store(err.into())
    }
}

/// The key a replay with a new key gives a message now carrying `current`:
/// `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "replay\n{id}\n{current}")`, hyphenated lower case.
///
/// Deterministic (a dry run shows the key the replay will use) and unique: it depends on the key
/// being replaced, so each replay with a new key gives the message a key it never had.
pub fn replay_downstream_key(id: Uuid, current: &str) -> String {
    Uuid::new_v5(
        &DOWNSTREAM_KEY_NAMESPACE,
        format!("replay\n{id}\n{current}").as_bytes(),
    )
    .to_string()
}

/// Lists the messages `filter` selects, hot, delivered and discarded alike, newest first; from
/// [`MessageFilter::before`] on when it is set (the next page: the last row's
/// [`MessageSummary::cursor`]).
pub async fn list_messages(
    client: &impl GenericClient,
    filter: &MessageFilter,
) -> Result<Vec<MessageSummary>, AdminError> {
    let status = filter.status.map(MessageStatus::as_str);
    let p = FilterParams::new(filter)?;
    let rows = client
        .query_typed(sql::LIST, &p.bind((&status, Type::TEXT)))
        .await?;
    rows.iter().map(summary_from_row).collect()
}

/// One message with its payload, headers, receipt and full attempt history.
pub async fn show_message(
    client: &impl GenericClient,
    id: Uuid,
) -> Result<MessageDetail, AdminError> {
    let row = client
        .query_typed_opt(sql::SHOW, &[(&id, Type::UUID)])
        .await?
        .ok_or(AdminError::NotFound(id))?;
    let headers: serde_json::Value = row.try_get(15)?;
    let history = client
        .query_typed(sql::HISTORY, &[(&id, Type::UUID)])
        .await?
        .iter()
        .map(|r| {
            Ok(AttemptRecord {
                attempt: r.try_get(0)?,
                downstream_key: r.try_get(1)?,
                relay: r.try_get(2)?,
                lease_token: r.try_get(3)?,
                outcome: r.try_get(4)?,
                error: r.try_get(5)?,
                receipt: r.try_get(6)?,
                started_at: r.try_get(7)?,
                finished_at: r.try_get(8)?,
            })
        })
        .collect::<Result<Vec<_>, AdminError>>()?;
    Ok(MessageDetail {
        message: summary_from_row(&row)?,
        payload: row.try_get(14)?,
        headers: serde_json::from_value(headers).unwrap_or_default(),
        receipt: row.try_get(16)?,
        history,
    })
}

/// Replays messages (see the module's replay rules). `client` runs the replay's own
/// transactions.
pub async fn replay(
    client: &mut Client,
    selection: &ReplaySelection,
    options: &ReplayOptions,
) -> Result<ReplayReport, AdminError> {
    replay_with_progress(client, selection, options, |_, _| {}).await
}

/// [`replay`], calling `progress(done, total)` after each batch.
pub async fn replay_with_progress(
    client: &mut Client,
    selection: &ReplaySelection,
    options: &ReplayOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<ReplayReport, AdminError> {
    let mut report = ReplayReport {
        dry_run: options.dry_run,
        ..ReplayReport::default()
    };
    match selection {
        ReplaySelection::Ids(ids) => {
            let mut seen = HashSet::new();
            let ids: Vec<Uuid> = ids.iter().copied().filter(|id| seen.insert(*id)).collect();
            check_bound(ids.len() as u64, options)?;
            let mut allowed = vec![MessageStatus::Failed, MessageStatus::Unknown];
            if options.include_delivered {
                allowed.push(MessageStatus::Delivered);
            }
            let tx = client.transaction().await?;
            let batch = replay_batch(&tx, &ids, &allowed, true, options).await?;
            finish(tx, &batch, options).await?;
            report.replayed = batch.replayed;
            progress(ids.len() as u64, ids.len() as u64);
        }
        ReplaySelection::Filter(filter) => {
            let allowed = replayed_statuses(filter, options)?;
            let names: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
            let p = FilterParams::new(filter)?;
            let ids: Vec<Uuid> = client
                .query_typed(sql::REPLAY_SELECT, &p.bind((&names, Type::TEXT_ARRAY)))
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
            let total = ids.len() as u64;
            check_bound(total, options)?;
            let mut done = 0;
            for chunk in ids.chunks(options.batch_size.max(1)) {
                let tx = client.transaction().await?;
                let batch = replay_batch(&tx, chunk, &allowed, false, options).await?;
                finish(tx, &batch, options).await?;
                report.replayed.extend(batch.replayed);
                report.skipped.extend(batch.skipped);
                done += chunk.len() as u64;
                progress(done, total);
            }
        }
    }
    Ok(report)
}

/// Closes failed or unknown messages without delivery (see the module's discard rules). `client`
/// runs the discard's own transactions.
pub async fn discard(
    client: &mut Client,
    selection: &ReplaySelection,
    options: &DiscardOptions,
) -> Result<DiscardReport, AdminError> {
    let reason = options.reason.trim();
    if reason.is_empty() {
        return Err(AdminError::Invalid(
            "a discard needs a reason (--reason): it is what the next operator reads".into(),
        ));
    }
    if reason.contains('\0') {
        return Err(AdminError::Invalid(
            "the reason holds a NUL character, which Postgres text cannot store".into(),
        ));
    }
    if options
        .operator
        .as_deref()
        .is_some_and(|n| n.contains('\0'))
    {
        return Err(AdminError::Invalid(
            "the operator's name holds a NUL character, which Postgres text cannot store".into(),
        ));
    }
    let mut report = DiscardReport {
        dry_run: options.dry_run,
        ..DiscardReport::default()
    };
    match selection {
        ReplaySelection::Ids(ids) => {
            let mut seen = HashSet::new();
            let ids: Vec<Uuid> = ids.iter().copied().filter(|id| seen.insert(*id)).collect();
            check_max(ids.len() as u64, options.max_rows)?;
            let allowed = [MessageStatus::Failed, MessageStatus::Unknown];
            let tx = client.transaction().await?;
            let batch = discard_batch(&tx, &ids, &allowed, true, reason, options).await?;
            commit_unless(tx, options.dry_run || batch.discarded.is_empty()).await?;
            report.discarded = batch.discarded;
        }
        ReplaySelection::Filter(filter) => {
            let allowed = match filter.status {
                None | Some(MessageStatus::Failed) => vec![MessageStatus::Failed],
                Some(MessageStatus::Unknown) => vec![MessageStatus::Unknown],
                Some(status) => {
                    return Err(AdminError::Invalid(format!(
                        "{status} rows are not discarded: only failed and unknown rows are"
                    )))
                }
            };
            let names: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
            let p = FilterParams::new(filter)?;
            let ids: Vec<Uuid> = client
                .query_typed(sql::DISCARD_SELECT, &p.bind((&names, Type::TEXT_ARRAY)))
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
            check_max(ids.len() as u64, options.max_rows)?;
            for chunk in ids.chunks(options.batch_size.max(1)) {
                let tx = client.transaction().await?;
                let batch = discard_batch(&tx, chunk, &allowed, false, reason, options).await?;
                commit_unless(tx, options.dry_run || batch.discarded.is_empty()).await?;
                report.discarded.extend(batch.discarded);
                report.skipped.extend(batch.skipped);
            }
        }
    }
    Ok(report)
}

/// What one discard transaction did.
struct DiscardBatch {
    discarded: Vec<DiscardedMessage>,
    skipped: Vec<SkippedMessage>,
}

/// Locks and checks `ids`, then (unless a dry run) discards them. `strict` (a discard by ids)
/// turns every refusal into the error of the whole discard; otherwise refused rows are skipped.
async fn discard_batch(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    allowed: &[MessageStatus],
    strict: bool,
    reason: &str,
    options: &DiscardOptions,
) -> Result<DiscardBatch, AdminError> {
    let mut batch = DiscardBatch {
        discarded: Vec::new(),
        skipped: Vec::new(),
    };
    if ids.is_empty() {
        return Ok(batch);
    }
    tx.query_typed(sql::LOCK_TIMEOUT, &[]).await?;
    let hot = if options.dry_run {
        sql::READ_HOT
    } else {
        sql::LOCK_HOT
    };
    let ids_vec = ids.to_vec();
    let mut found: HashMap<Uuid, Candidate> = HashMap::new();
    for row in tx.query_typed(hot, &[(&ids_vec, Type::UUID_ARRAY)]).await? {
        let candidate = Candidate {
            id: row.try_get(0)?,
            status: row.try_get::<_, String>(1)?.parse()?,
            destination: row.try_get(2)?,
            downstream_key: row.try_get(3)?,
            ordering_key: row.try_get(4)?,
            lease_owner: row.try_get(5)?,
            lease_expires_at: row.try_get(6)?,
            leased: row.try_get(7)?,
        };
        found.insert(candidate.id, candidate);
    }
    for id in ids {
        let Some(c) = found.remove(id) else {
            if strict {
                return Err(match not_found(tx, *id).await? {
                    AdminError::NotReplayable { id, status, .. } => AdminError::NotReplayable {
                        id,
                        status,
                        reason: "it was discarded already".into(),
                    },
                    other => other,
                });
            }
            batch.skipped.push(SkippedMessage {
                id: *id,
                reason: "it left the outbox meanwhile".into(),
            });
            continue;
        };
        let refused = if c.status == MessageStatus::InFlight && c.leased {
            Some(AdminError::Leased {
                id: c.id,
                owner: c.lease_owner.clone().unwrap_or_default(),
                expires_at: c.lease_expires_at.unwrap_or_else(Utc::now),
            })
        } else if allowed.contains(&c.status) {
            None
        } else {
            Some(AdminError::NotReplayable {
                id: c.id,
                status: c.status,
                reason: "only failed and unknown rows are discarded (a pending or in-flight row \
                         is still being delivered)"
                    .into(),
            })
        };
        match refused {
            Some(refused) if strict => return Err(refused),
            Some(refused) => batch.skipped.push(SkippedMessage {
                id: c.id,
                reason: refused.to_string(),
            }),
            None => batch.discarded.push(DiscardedMessage {
                id: c.id,
                destination: c.destination,
                from: c.status,
                ordering_key: c.ordering_key,
            }),
        }
    }
    if options.dry_run || batch.discarded.is_empty() {
        return Ok(batch);
    }
    let ids: Vec<Uuid> = batch.discarded.iter().map(|d| d.id).collect();
    let note = discard_note(reason, options.operator.as_deref());
    tx.query_typed(
        sql::DISCARD,
        &[
            (&ids, Type::UUID_ARRAY),
            (&reason, Type::TEXT),
            (&note, Type::TEXT),
        ],
    )
    .await?;
    tx.query_typed(sql::NOTIFY, &[]).await?;
    Ok(batch)
}

/// The attempt-log text of a discard: the reason, and who gave it when known (as a replay's note
/// names them).
fn discard_note(reason: &str, operator: Option<&str>) -> String {
    match operator {
        Some(name) => format!("{reason} (by operator {name})"),
        None => reason.to_owned(),
    }
}

/// Commits `tx`, or rolls it back when `rollback` (a dry run, or nothing changed).
async fn commit_unless(tx: Transaction<'_>, rollback: bool) -> Result<(), AdminError> {
    if rollback {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(())
}

/// Deletes rows past their state's retention ([`Retention`]: delivered, failed, unknown and
/// discarded rows) with their attempt-log rows, attempt-log rows of messages already gone, and (by
/// default) expired idempotency keys, in bounded batches that each commit on their own, so no long
/// lock is held and relays are never waited for. A failed or unknown head that is purged stops
/// blocking its ordering key: the next row is due at once.
pub async fn purge(client: &Client, options: &PurgeOptions) -> Result<PurgeReport, AdminError> {
    purge_with_progress(client, options, |_, _| {}).await
}

/// [`purge`], calling `progress(done, total)` (in rows) after each batch.
pub async fn purge_with_progress(
    client: &Client,
    options: &PurgeOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<PurgeReport, AdminError> {
    let cutoff_of = |retention: Duration| async move {
        let secs = retention.as_secs_f64();
        let at: DateTime<Utc> = client
            .query_typed_one(sql::PURGE_CUTOFF, &[(&secs, Type::FLOAT8)])
            .await?
            .try_get(0)?;
        Ok::<_, AdminError>(at)
    };
    let r = &options.retention;
    let cutoff = cutoff_of(r.delivered).await?;
    let failed_cutoff = cutoff_of(r.failed).await?;
    let unknown_cutoff = cutoff_of(r.unknown).await?;
    let discarded_cutoff = cutoff_of(r.discarded).await?;
    let counts = client
        .query_typed_one(
            sql::PURGE_COUNTS,
            &[
                (&cutoff, Type::TIMESTAMPTZ),
                (&failed_cutoff, Type::TIMESTAMPTZ),
                (&unknown_cutoff, Type::TIMESTAMPTZ),
                (&discarded_cutoff, Type::TIMESTAMPTZ),
            ],
        )
        .await?;
    let count = |i: usize| -> Result<u64, AdminError> { Ok(counts.try_get::<_, i64>(i)? as u64) };
    let mut report = PurgeReport {
        dry_run: options.dry_run,
        cutoff,
        delivered: count(0)?,
        failed: count(1)?,
        unknown: count(2)?,
        discarded: count(3)?,
        attempts: count(4)? + count(5)?,
        expired_keys: if options.expired_keys { count(6)? } else { 0 },
    };
    if options.dry_run {
        return Ok(report);
    }
    let batch = options.batch.max(1);
    let total = report.delivered + report.failed + report.unknown + report.discarded + count(5)?;
    let (mut done, mut logs) = (0u64, 0u64);
    // Runs one batch statement until a batch comes back short; returns the rows it deleted.
    let mut drain = async |statement: &str,
                           params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)]|
           -> Result<u64, AdminError> {
        let mut deleted = 0;
        loop {
            let row = client.query_typed_one(statement, params).await?;
            let (rows, attempts): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
            deleted += rows as u64;
            logs += attempts as u64;
            done += rows as u64;
            progress(done.min(total), total);
            if rows < batch {
                return Ok(deleted);
            }
        }
    };
    report.delivered = drain(
        sql::PURGE_DELIVERED_BATCH,
        &[(&cutoff, Type::TIMESTAMPTZ), (&batch, Type::INT8)],
    )
    .await?;
    report.discarded = drain(
        sql::PURGE_DISCARDED_BATCH,
        &[(&discarded_cutoff, Type::TIMESTAMPTZ), (&batch, Type::INT8)],
    )
    .await?;
    report.failed = drain(
        sql::PURGE_HOT_BATCH,
        &[
            (&"failed", Type::TEXT),
            (&failed_cutoff, Type::TIMESTAMPTZ),
            (&batch, Type::INT8),
        ],
    )
    .await?;
    report.unknown = drain(
        sql::PURGE_HOT_BATCH,
        &[
            (&"unknown", Type::TEXT),
            (&unknown_cutoff, Type::TIMESTAMPTZ),
            (&batch, Type::INT8),
        ],
    )
    .await?;
    loop {
        let rows = client
            .query_typed(
                sql::PURGE_ORPHAN_ATTEMPTS_BATCH,
                &[(&cutoff, Type::TIMESTAMPTZ), (&batch, Type::INT8)],
            )
            .await?
            .len() as i64;
        logs += rows as u64;
        done += rows as u64;
        progress(done.min(total), total);
        if rows < batch {
            break;
        }
    }
    report.attempts = logs;
    if report.failed + report.unknown > 0 {
        client.query_typed(sql::NOTIFY, &[]).await?;
    }
    report.expired_keys = if options.expired_keys {
        crate::prune_expired_keys(client, batch).await?
    } else {
        0
    };
    Ok(report)
}

/// Counts by destination and state, the oldest pending row's age, and the failure rate of the
/// last hour's attempts. The delivered history is never scanned: up to
/// [`EXACT_DELIVERED_COUNT_MAX`] rows it is counted through an index, above it the planner's
/// estimate is reported ([`OutboxStats::delivered_estimated`]).
pub async fn stats(client: &impl GenericClient) -> Result<OutboxStats, AdminError> {
    let mut by_destination: BTreeMap<String, DestinationStats> = BTreeMap::new();
    let hot_bound = EXACT_HOT_COUNT_MAX + 1;
    // The planner's size of the hot table (-1: never analysed) spares a large backlog the
    // bounded exact read; a table that grew since is caught by the bound.
    let tuples = client
        .query_typed_one(sql::STATS_HOT_TUPLES, &[])
        .await?
        .try_get::<_, f64>(0)?;
    let counted = if tuples > 4.0 * hot_bound as f64 {
        None
    } else {
        Some(
            client
                .query_typed(sql::STATS_COUNTS, &[(&hot_bound, Type::INT8)])
                .await?,
        )
    };
    let exact_total: Option<i64> = counted
        .as_ref()
        .map(|rows| rows.iter().map(|r| r.try_get::<_, i64>(2)).sum())
        .transpose()?;
    let hot_estimated = exact_total.is_none_or(|n| n >= hot_bound);
    let mut hot_rows = match counted {
        Some(rows) if !hot_estimated => rows,
        _ => {
            // Enough pages for about 20 000 rows, whatever the backlog's size.
            let size = tuples.max(hot_bound as f64);
            let percent = (100.0 * 20_000.0 / size).clamp(0.01, 100.0) as f32;
            let mut rows = client
                .query_typed(sql::STATS_HOT_SAMPLE, &[(&percent, Type::FLOAT4)])
                .await?;
            rows.extend(client.query_typed(sql::STATS_HOT_FEW, &[]).await?);
            rows
        }
    };
    hot_rows.extend(client.query_typed(sql::STATS_DISCARDED, &[]).await?);
    for row in &hot_rows {
        let status: MessageStatus = row.try_get::<_, String>(1)?.parse()?;
        let n: i64 = row.try_get(2)?;
        let age: Option<f64> = row.try_get(3)?;
        let stats = destination_entry(&mut by_destination, row.try_get(0)?);
        stats.counts.add(status, n as u64);
        if status == MessageStatus::Pending {
            stats.oldest_pending_age = age.map(|s| Duration::from_secs_f64(s.max(0.0)));
        }
    }
    let bound = EXACT_DELIVERED_COUNT_MAX + 1;
    let exact = client
        .query_typed(sql::STATS_DELIVERED_EXACT, &[(&bound, Type::INT8)])
        .await?;
    let mut counted: Vec<(String, i64)> = Vec::with_capacity(exact.len());
    for row in &exact {
        counted.push((row.try_get(0)?, row.try_get(1)?));
    }
    let delivered_estimated = counted.iter().map(|(_, n)| n).sum::<i64>() >= bound;
    let mut estimated_total = 0;
    if delivered_estimated {
        let row = client
            .query_typed_one(sql::STATS_DELIVERED_ESTIMATE, &[])
            .await?;
        // Never analysed (-1) or analysed while smaller: at least what was just counted.
        let tuples = row.try_get::<_, f64>(0)?.max(bound as f64);
        let values: Option<Vec<String>> = row.try_get(1)?;
        let freqs: Option<Vec<f64>> = row.try_get(2)?;
        for (destination, freq) in values
            .unwrap_or_default()
            .into_iter()
            .zip(freqs.unwrap_or_default())
        {
            destination_entry(&mut by_destination, destination)
                .counts
                .delivered = (freq * tuples).round() as u64;
        }
        estimated_total = tuples.round() as u64;
    } else {
        for (destination, n) in counted {
            destination_entry(&mut by_destination, destination)
                .counts
                .delivered = n as u64;
        }
    }
    let window = FAILURE_RATE_WINDOW.as_secs_f64();
    let (mut attempts, mut failures) = (0, 0);
    for row in client
        .query_typed(sql::STATS_ATTEMPTS, &[(&window, Type::FLOAT8)])
        .await?
    {
        let (n, failed): (i64, i64) = (row.try_get(1)?, row.try_get(2)?);
        attempts += n as u64;
        failures += failed as u64;
        destination_entry(&mut by_destination, row.try_get(0)?).last_hour =
            FailureRate::new(n as u64, failed as u64);
    }
    let mut total = StatusCounts::default();
    for stats in by_destination.values() {
        for status in MessageStatus::ALL {
            total.add(status, stats.counts.get(status));
        }
    }
    if delivered_estimated {
        // The destinations the sample missed are in the total only.
        total.delivered = total.delivered.max(estimated_total);
    }
    let oldest_pending_age = if hot_estimated {
        // The sample's oldest rows are not the backlog's: read the oldest one exactly.
        client
            .query_typed_one(sql::STATS_OLDEST_PENDING, &[])
            .await?
            .try_get::<_, Option<f64>>(0)?
            .map(|s| Duration::from_secs_f64(s.max(0.0)))
    } else {
        by_destination
            .values()
            .filter_map(|s| s.oldest_pending_age)
            .max()
    };
    Ok(OutboxStats {
        destinations: by_destination.into_values().collect(),
        total,
        oldest_pending_age,
        last_hour: FailureRate::new(attempts, failures),
        delivered_estimated,
        hot_estimated,
        flow: destination_flows(client)
            .await?
            .into_iter()
            .filter(DestinationFlow::is_notable)
            .collect(),
    })
}

/// Failed rows of one destination whose errors are the same once normalised: [`failure_groups`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailureGroup {
    /// The destination.
    pub destination: String,
    /// The normalised error text (UUIDs as `<uuid>`, digits as `<n>`; `""` without an error):
    /// the [`MessageFilter::error_class`] that selects the group.
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

/// Failed rows grouped by destination and normalised error text, the largest groups first, at
/// most `limit` groups.
pub async fn failure_groups(
    client: &impl GenericClient,
    limit: u64,
) -> Result<Vec<FailureGroup>, AdminError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    client
        .query_typed(sql::FAILURE_GROUPS, &[(&limit, Type::INT8)])
        .await?
        .iter()
        .map(|r| {
            Ok(FailureGroup {
                destination: r.try_get(0)?,
                error: r.try_get(1)?,
                count: r.try_get::<_, i64>(2)? as u64,
                first_seen: r.try_get(3)?,
                last_seen: r.try_get(4)?,
                example: r.try_get(5)?,
            })
        })
        .collect()
}

/// One minute of the outbox's recent life: [`activity`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MinuteActivity {
    /// The minute's start.
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
    client
        .query_typed(sql::ACTIVITY, &[(&minutes, Type::INT4)])
        .await?
        .iter()
        .map(|r| {
            Ok(MinuteActivity {
                minute: r.try_get(0)?,
                delivered: r.try_get::<_, i64>(1)? as u64,
                failed: r.try_get::<_, i64>(2)? as u64,
                latency_p50: r.try_get(3)?,
                latency_p99: r.try_get(4)?,
            })
        })
        .collect()
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
    /// Its headers, in order.
    pub response_headers: Vec<(String, String)>,
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
/// the claim derives for one of `effects` ([`crate::Claim::downstream_key`]). `None` when no such
/// key is stored (never used, or pruned).
pub async fn lookup_key(
    client: &impl GenericClient,
    scope: &str,
    key: &str,
    effects: &[String],
) -> Result<Option<KeyLookup>, AdminError> {
    let Some(row) = client
        .query_typed_opt(sql::KEY, &[(&scope, Type::TEXT), (&key, Type::TEXT)])
        .await?
    else {
        return Ok(None);
    };
    let headers: Option<serde_json::Value> = row.try_get(5)?;
    let status: Option<i16> = row.try_get(4)?;
    let fingerprint: Vec<u8> = row.try_get(2)?;
    let record = IdempotencyRecord {
        scope: row.try_get(0)?,
        key: row.try_get(1)?,
        fingerprint: fingerprint.iter().map(|b| format!("{b:02x}")).collect(),
        state: row.try_get(3)?,
        response_status: status.and_then(|s| u16::try_from(s).ok()),
        response_headers: headers
            .and_then(|h| serde_json::from_value(h).ok())
            .unwrap_or_default(),
        response_body: row.try_get(6)?,
        claimed_at: row.try_get(7)?,
        expires_at: row.try_get(8)?,
        expired: row.try_get(10)?,
    };
    let claimed_micros: i64 = row.try_get(9)?;
    let derived: Vec<String> = match crate::IdempotencyKey::parse(key) {
        Ok(parsed) => effects
            .iter()
            .map(|effect| {
                crate::outbox::derive_claim_downstream_key(scope, &parsed, claimed_micros, effect)
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let messages = client
        .query_typed(
            sql::KEY_MESSAGES,
            &[
                (&record.claimed_at, Type::TIMESTAMPTZ),
                (&derived, Type::TEXT_ARRAY),
            ],
        )
        .await?
        .iter()
        .map(summary_from_row)
        .collect::<Result<_, _>>()?;
    Ok(Some(KeyLookup { record, messages }))
}

fn destination_entry(
    map: &mut BTreeMap<String, DestinationStats>,
    destination: String,
) -> &mut DestinationStats {
    map.entry(destination.clone())
        .or_insert_with(|| DestinationStats {
            destination,
            counts: StatusCounts::default(),
            oldest_pending_age: None,
            last_hour: FailureRate::default(),
        })
}

/// A filter's parameters, as the statements bind them.
struct FilterParams {
    destination: Option<String>,
    since_at: Option<DateTime<Utc>>,
    since_ago: Option<f64>,
    until_at: Option<DateTime<Utc>>,
    until_ago: Option<f64>,
    downstream_key: Option<String>,
    ordering_key: Option<String>,
    limit: Option<i64>,
    error_contains: Option<String>,
    error_class: Option<String>,
    before_at: Option<DateTime<Utc>>,
    before_seq: Option<i64>,
}

type Param<'a> = (&'a (dyn tokio_postgres::types::ToSql + Sync), Type);

impl FilterParams {
    /// The statement's parameters: `first` as $1, then the filter's ($2..$13).
    fn bind<'a>(&'a self, first: Param<'a>) -> [Param<'a>; 13] {
        [
            first,
            (&self.destination, Type::TEXT),
            (&self.since_at, Type::TIMESTAMPTZ),
            (&self.since_ago, Type::FLOAT8),
            (&self.until_at, Type::TIMESTAMPTZ),
            (&self.until_ago, Type::FLOAT8),
            (&self.downstream_key, Type::TEXT),
            (&self.ordering_key, Type::TEXT),
            (&self.limit, Type::INT8),
            (&self.error_contains, Type::TEXT),
            (&self.error_class, Type::TEXT),
            (&self.before_at, Type::TIMESTAMPTZ),
            (&self.before_seq, Type::INT8),
        ]
    }

    fn new(filter: &MessageFilter) -> Result<Self, AdminError> {
        let split = |bound: Option<TimeBound>| match bound {
            None => (None, None),
            Some(TimeBound::At(at)) => (Some(at), None),
            Some(TimeBound::Ago(ago)) => (None, Some(ago.as_secs_f64())),
        };
        let (since_at, since_ago) = split(filter.since);
        let (until_at, until_ago) = split(filter.until);
        let limit = filter
            .limit
            .map(|n| {
                i64::try_from(n).map_err(|_| AdminError::Invalid(format!("limit {n} is too big")))
            })
            .transpose()?;
        Ok(Self {
            destination: filter.destination.clone(),
            since_at,
            since_ago,
            until_at,
            until_ago,
            downstream_key: filter.downstream_key.clone(),
            ordering_key: filter.ordering_key.clone(),
            limit,
            error_contains: filter.error_contains.clone(),
            error_class: filter.error_class.clone(),
            before_at: filter.before.map(|c| c.created_at),
            before_seq: filter.before.map(|c| c.seq),
        })
    }
}

fn summary_from_row(row: &Row) -> Result<MessageSummary, AdminError> {
    Ok(MessageSummary {
        id: row.try_get(0)?,
        seq: row.try_get(1)?,
        destination: row.try_get(2)?,
        status: row.try_get::<_, String>(3)?.parse()?,
        downstream_key: row.try_get(4)?,
        ordering_key: row.try_get(5)?,
        attempts: row.try_get(6)?,
        created_at: row.try_get(7)?,
        next_attempt_at: row.try_get(8)?,
        delivered_at: row.try_get(9)?,
        last_error: row.try_get(10)?,
        lease_owner: row.try_get(11)?,
        lease_expires_at: row.try_get(12)?,
        discarded_at: row.try_get(13)?,
    })
}

/// The statuses a replay by `filter` acts on.
fn replayed_statuses(
    filter: &MessageFilter,
    options: &ReplayOptions,
) -> Result<Vec<MessageStatus>, AdminError> {
    let mut statuses = match filter.status {
        None | Some(MessageStatus::Failed) => vec![MessageStatus::Failed],
        Some(MessageStatus::Unknown) => vec![MessageStatus::Unknown],
        Some(MessageStatus::Delivered) if options.include_delivered => vec![],
        Some(MessageStatus::Delivered) => {
            return Err(AdminError::Invalid(
                "delivered rows are replayed only with include_delivered (--include-delivered): \
                 their effect is sent again"
                    .into(),
            ))
        }
        Some(
            status @ (MessageStatus::Pending | MessageStatus::InFlight | MessageStatus::Discarded),
        ) => {
            return Err(AdminError::Invalid(format!(
                "{status} rows are not replayed: only failed, unknown and delivered rows are"
            )))
        }
    };
    if options.include_delivered {
        statuses.push(MessageStatus::Delivered);
    }
    Ok(statuses)
}

/// Why a discarded row is neither replayed nor discarded again.
const DISCARDED_REASON: &str = "an operator discarded it (see its history for the reason); \
     enqueue the effect again to send it";

/// The error for an id that is in no table a replay or discard reads: [`AdminError::NotFound`],
/// or [`AdminError::NotReplayable`] when the row was discarded.
async fn not_found(client: &impl GenericClient, id: Uuid) -> Result<AdminError, AdminError> {
    let discarded: bool = client
        .query_typed_one(sql::IS_DISCARDED, &[(&id, Type::UUID)])
        .await?
        .try_get(0)?;
    Ok(if discarded {
        AdminError::NotReplayable {
            id,
            status: MessageStatus::Discarded,
            reason: DISCARDED_REASON.to_owned(),
        }
    } else {
        AdminError::NotFound(id)
    })
}

fn check_bound(count: u64, options: &ReplayOptions) -> Result<(), AdminError> {
    check_max(count, options.max_rows)
}

fn check_max(count: u64, max_rows: Option<u64>) -> Result<(), AdminError> {
    match max_rows {
        Some(max) if count > max => Err(AdminError::TooMany { count, max }),
        _ => Ok(()),
    }
}

/// A selected row as the replay found it, locked.
struct Candidate {
    id: Uuid,
    status: MessageStatus,
    destination: String,
    downstream_key: String,
    ordering_key: Option<String>,
    lease_owner: Option<String>,
    lease_expires_at: Option<DateTime<Utc>>,
    leased: bool,
}

/// What one replay transaction did.
struct Batch {
    replayed: Vec<ReplayedMessage>,
    skipped: Vec<SkippedMessage>,
    delivered: Vec<Option<String>>,
}

/// Why `candidate` is not replayed, if it is not.
fn refusal(candidate: &Candidate, allowed: &[MessageStatus]) -> Option<AdminError> {
    let status = candidate.status;
    if status == MessageStatus::InFlight && candidate.leased {
        return Some(AdminError::Leased {
            id: candidate.id,
            owner: candidate.lease_owner.clone().unwrap_or_default(),
            expires_at: candidate.lease_expires_at.unwrap_or_else(Utc::now),
        });
    }
    if allowed.contains(&status) {
        return None;
    }
    let reason = match status {
        MessageStatus::Pending => "it waits for delivery already".to_owned(),
        MessageStatus::InFlight => "its lease ran out; a relay takes it back shortly (to pending, \
             or to unknown for an at-most-once destination)"
            .to_owned(),
        MessageStatus::Delivered => "replaying it sends the effect again: set include_delivered \
             (--include-delivered) to do that"
            .to_owned(),
        MessageStatus::Failed | MessageStatus::Unknown => {
            format!("{status} rows are not selected")
        }
        MessageStatus::Discarded => DISCARDED_REASON.to_owned(),
    };
    Some(AdminError::NotReplayable {
        id: candidate.id,
        status,
        reason,
    })
}

/// Locks and checks `ids`, then (unless a dry run) replays them. `strict` (a replay by ids) turns
/// every refusal into the error of the whole replay; otherwise refused rows are skipped.
async fn replay_batch(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    allowed: &[MessageStatus],
    strict: bool,
    options: &ReplayOptions,
) -> Result<Batch, AdminError> {
    let mut batch = Batch {
        replayed: Vec::new(),
        skipped: Vec::new(),
        delivered: Vec::new(),
    };
    if ids.is_empty() {
        return Ok(batch);
    }
    tx.query_typed(sql::LOCK_TIMEOUT, &[]).await?;
    let (hot, delivered) = if options.dry_run {
        (sql::READ_HOT, sql::READ_DELIVERED)
    } else {
        (sql::LOCK_HOT, sql::LOCK_DELIVERED)
    };
    let ids_vec = ids.to_vec();
    let mut found: HashMap<Uuid, Candidate> = HashMap::new();
    for row in tx.query_typed(hot, &[(&ids_vec, Type::UUID_ARRAY)]).await? {
        let candidate = Candidate {
            id: row.try_get(0)?,
            status: row.try_get::<_, String>(1)?.parse()?,
            destination: row.try_get(2)?,
            downstream_key: row.try_get(3)?,
            ordering_key: row.try_get(4)?,
            lease_owner: row.try_get(5)?,
            lease_expires_at: row.try_get(6)?,
            leased: row.try_get(7)?,
        };
        found.insert(candidate.id, candidate);
    }
    let rest: Vec<Uuid> = ids
        .iter()
        .filter(|id| !found.contains_key(id))
        .copied()
        .collect();
    if !rest.is_empty() {
        for row in tx
            .query_typed(delivered, &[(&rest, Type::UUID_ARRAY)])
            .await?
        {
            let candidate = Candidate {
                id: row.try_get(0)?,
                status: MessageStatus::Delivered,
                destination: row.try_get(1)?,
                downstream_key: row.try_get(2)?,
                ordering_key: row.try_get(3)?,
                lease_owner: None,
                lease_expires_at: None,
                leased: false,
            };
            found.insert(candidate.id, candidate);
        }
    }

    let mut plan = Vec::new();
    for id in ids {
        let Some(candidate) = found.remove(id) else {
            if strict {
                return Err(not_found(tx, *id).await?);
            }
            batch.skipped.push(SkippedMessage {
                id: *id,
                reason: "it was purged meanwhile".into(),
            });
            continue;
        };
        match refusal(&candidate, allowed) {
            Some(refused) if strict => return Err(refused),
            Some(refused) => batch.skipped.push(SkippedMessage {
                id: *id,
                reason: refused.to_string(),
            }),
            None => plan.push(candidate),
        }
    }

    // A delivered row that keeps its key must not meet the same (destination, key) in the hot
    // table: the effect was enqueued again since, or another row of this replay takes it back.
    let mut taken: HashMap<Uuid, Uuid> = HashMap::new();
    if !options.new_key {
        let back: Vec<&Candidate> = plan
            .iter()
            .filter(|c| c.status == MessageStatus::Delivered)
            .collect();
        if !back.is_empty() {
            let ids: Vec<Uuid> = back.iter().map(|c| c.id).collect();
            let destinations: Vec<&str> = back.iter().map(|c| c.destination.as_str()).collect();
            let keys: Vec<&str> = back.iter().map(|c| c.downstream_key.as_str()).collect();
            for row in tx
                .query_typed(
                    sql::KEY_TAKEN,
                    &[
                        (&ids, Type::UUID_ARRAY),
                        (&destinations, Type::TEXT_ARRAY),
                        (&keys, Type::TEXT_ARRAY),
                    ],
                )
                .await?
            {
                taken.insert(row.try_get(0)?, row.try_get(1)?);
            }
            let mut first: HashMap<(&str, &str), Uuid> = HashMap::new();
            for c in &back {
                let earlier = *first
                    .entry((c.destination.as_str(), c.downstream_key.as_str()))
                    .or_insert(c.id);
                if earlier != c.id {
                    taken.entry(c.id).or_insert(earlier);
                }
            }
        }
    }

    let (mut hot_ids, mut hot_keys) = (Vec::new(), Vec::new());
    let (mut back_ids, mut back_keys) = (Vec::new(), Vec::new());
    let mut notes = Vec::new();
    for c in plan {
        if let Some(other) = taken.get(&c.id) {
            let conflict = AdminError::KeyConflict {
                id: c.id,
                other: *other,
                downstream_key: c.downstream_key.clone(),
            };
            if strict {
                return Err(conflict);
            }
            batch.skipped.push(SkippedMessage {
                id: c.id,
                reason: conflict.to_string(),
            });
            continue;
        }
        let key = if options.new_key {
            replay_downstream_key(c.id, &c.downstream_key)
        } else {
            c.downstream_key.clone()
        };
        let by = match &options.operator {
            Some(name) => format!("operator {name}"),
            None => "an operator".to_owned(),
        };
        notes.push(if options.new_key {
            format!(
                "replayed from {} by {by}; new downstream key {key} replaces {}",
                c.status, c.downstream_key
            )
        } else {
            format!("replayed from {} by {by}; downstream key kept", c.status)
        });
        if c.status == MessageStatus::Delivered {
            back_ids.push(c.id);
            back_keys.push(key.clone());
            batch.delivered.push(c.ordering_key.clone());
        } else {
            hot_ids.push(c.id);
            hot_keys.push(key.clone());
        }
        batch.replayed.push(ReplayedMessage {
            id: c.id,
            destination: c.destination,
            from: c.status,
            replaced_key: options.new_key.then_some(c.downstream_key),
            downstream_key: key,
        });
    }
    if options.dry_run || batch.replayed.is_empty() {
        return Ok(batch);
    }

    if !hot_ids.is_empty() {
        tx.query_typed(
            sql::REPLAY_HOT,
            &[(&hot_ids, Type::UUID_ARRAY), (&hot_keys, Type::TEXT_ARRAY)],
        )
        .await?;
    }
    if !back_ids.is_empty() {
        // Re-inserted rows take a new seq: under the ordering-key locks enqueue takes, so that
        // seq stays commit order within a key.
        lock_ordering_keys(tx, &batch.delivered).await?;
        tx.query_typed(
            sql::MOVE_DELIVERED,
            &[
                (&back_ids, Type::UUID_ARRAY),
                (&back_keys, Type::TEXT_ARRAY),
            ],
        )
        .await?;
    }
    let ids: Vec<Uuid> = batch.replayed.iter().map(|r| r.id).collect();
    let keys: Vec<&str> = batch
        .replayed
        .iter()
        .map(|r| r.downstream_key.as_str())
        .collect();
    tx.query_typed(
        sql::LOG_REPLAYS,
        &[
            (&ids, Type::UUID_ARRAY),
            (&keys, Type::TEXT_ARRAY),
            (&notes, Type::TEXT_ARRAY),
        ],
    )
    .await?;
    tx.query_typed(sql::NOTIFY, &[]).await?;
    Ok(batch)
}

/// Commits a batch's transaction, or rolls a dry run's back.
async fn finish(
    tx: Transaction<'_>,
    batch: &Batch,
    options: &ReplayOptions,
) -> Result<(), AdminError> {
    if options.dry_run || batch.replayed.is_empty() {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(())
}

fn secs<S: serde::Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(d) => serializer.serialize_some(&d.as_secs_f64()),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_keys_are_deterministic_and_new_at_each_replay() {
        let id = Uuid::now_v7();
        let first = replay_downstream_key(id, "k-1");
        assert_eq!(first, replay_downstream_key(id, "k-1"));
        assert_ne!(first, "k-1");
        assert_ne!(replay_downstream_key(id, &first), first);
        assert_ne!(replay_downstream_key(Uuid::now_v7(), "k-1"), first);
    }

    #[test]
    fn a_discard_note_names_the_operator_after_the_reason() {
        assert_eq!(
            discard_note("refunded by hand", Some("alice")),
            "refunded by hand (by operator alice)"
        );
        assert_eq!(discard_note("refunded by hand", None), "refunded by hand");
    }

    #[test]
    fn statuses_parse_from_their_column_values() {
        for status in MessageStatus::ALL {
            assert_eq!(status.as_str().parse::<MessageStatus>().ok(), Some(status));
        }
        assert_eq!(
            "in-flight".parse::<MessageStatus>().ok(),
            Some(MessageStatus::InFlight)
        );
        assert!("dead".parse::<MessageStatus>().is_err());
    }

    #[test]
    fn replay_by_filter_takes_failed_rows_unless_unknown_is_asked_for() {
        let opts = ReplayOptions::default();
        let filter = |status| MessageFilter {
            status,
            ..MessageFilter::default()
        };
        assert_eq!(
            replayed_statuses(&filter(None), &opts).ok(),
            Some(vec![MessageStatus::Failed])
        );
        assert_eq!(
            replayed_statuses(&filter(Some(MessageStatus::Unknown)), &opts).ok(),
            Some(vec![MessageStatus::Unknown])
        );
        assert!(replayed_statuses(&filter(Some(MessageStatus::Delivered)), &opts).is_err());
        assert!(replayed_statuses(&filter(Some(MessageStatus::Pending)), &opts).is_err());
        let with_delivered = ReplayOptions {
            include_delivered: true,
            ..ReplayOptions::default()
        };
        assert_eq!(
            replayed_statuses(&filter(None), &with_delivered).ok(),
            Some(vec![MessageStatus::Failed, MessageStatus::Delivered])
        );
        assert_eq!(
            replayed_statuses(&filter(Some(MessageStatus::Delivered)), &with_delivered).ok(),
            Some(vec![MessageStatus::Delivered])
        );
    }
}
