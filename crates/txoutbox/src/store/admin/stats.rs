//! What `stats` reads: bounded counts, samples and the planner's estimates.

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};

use crate::admin::AdminError;
use crate::state::MessageStatus;

/// Hot rows by destination and status, with the age in seconds of each group's oldest row (used
/// for `pending`), counted exactly but reading at most $1 rows: when the counts add up to $1, the
/// backlog is larger and [`STATS_HOT_SAMPLE`] answers instead. The delivered history is counted
/// by [`STATS_DELIVERED_EXACT`] or [`STATS_DELIVERED_ESTIMATE`], never by a scan.
const STATS_COUNTS: &str = "SELECT destination, status, count(*), \
         EXTRACT(EPOCH FROM now() - min(created_at))::float8 \
     FROM (SELECT destination, status, created_at FROM txoutbox_messages LIMIT $1) h \
     GROUP BY destination, status";

/// Discarded rows by destination (a small table: rows leave it only by the operator's hand).
const STATS_DISCARDED: &str = "SELECT destination, 'discarded', count(*), NULL::float8 \
     FROM txoutbox_discarded GROUP BY destination";

/// A backlog too large to count at each look: its pending rows from a sample of $1 percent of
/// the hot table's pages, scaled by 100 / $1, by destination, with the oldest row of each in the
/// sample. The same pages each time (a fixed seed): they stay cached, and a refreshed page does
/// not jump between two samples' figures.
const STATS_HOT_SAMPLE: &str = "SELECT destination, status, \
         round(count(*) * 100.0 / $1)::int8, EXTRACT(EPOCH FROM now() - min(created_at))::float8 \
     FROM txoutbox_messages TABLESAMPLE SYSTEM ($1) REPEATABLE (0) \
     WHERE status = 'pending' GROUP BY destination, status";

/// The rows a large backlog still counts exactly, through their small partial indexes: in flight
/// (`txoutbox_messages_lease`), failed and unknown (`txoutbox_messages_dead`).
const STATS_HOT_FEW: &str = "SELECT destination, status, count(*), NULL::float8 \
     FROM txoutbox_messages WHERE status = 'in_flight' GROUP BY destination, status \
     UNION ALL \
     SELECT destination, status, count(*), NULL::float8 \
     FROM txoutbox_messages WHERE status IN ('failed', 'unknown') GROUP BY destination, status";

/// How long ago the oldest pending row was enqueued, exactly: the first pending entry of the
/// `(created_at, seq)` index.
const STATS_OLDEST_PENDING: &str = "SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float8 \
     FROM txoutbox_messages WHERE status = 'pending'";

/// Keys whose deferred effects the relay has not fanned out yet, counted through the partial
/// index `txoutbox_idempotency_keys_effects` but reading at most $1 of them, with how long ago
/// the oldest was stored.
const STATS_FAN_OUT: &str = "SELECT count(*), \
         EXTRACT(EPOCH FROM now() - min(created_at))::float8 \
     FROM (SELECT created_at FROM txoutbox_idempotency_keys WHERE effects IS NOT NULL \
         ORDER BY created_at LIMIT $1) k";

/// Inbox records (`txoutbox_inbox`), expired ones awaiting the purge, and messages consumers
/// gave up (through the partial index `txoutbox_inbox_failed`), each reading at most $1 rows.
const STATS_INBOX: &str = "SELECT \
     (SELECT count(*) FROM (SELECT 1 FROM txoutbox_inbox LIMIT $1) a), \
     (SELECT count(*) FROM (SELECT 1 FROM txoutbox_inbox WHERE expires_at <= now() LIMIT $1) e), \
     (SELECT count(*) FROM (SELECT 1 FROM txoutbox_inbox WHERE outcome = 'failed' LIMIT $1) f)";

/// The hot table's size as the planner last saw it (`pg_class.reltuples`; -1: never analysed).
const STATS_HOT_TUPLES: &str =
    "SELECT reltuples::float8 FROM pg_class WHERE oid = 'txoutbox_messages'::regclass";

/// Delivered rows by destination, counted exactly but reading at most $1 entries of the index
/// `txoutbox_delivered_key`: when the counts add up to $1, the history is larger and
/// [`STATS_DELIVERED_ESTIMATE`] answers instead.
const STATS_DELIVERED_EXACT: &str = "SELECT destination, count(*) FROM ( \
     SELECT destination FROM txoutbox_delivered ORDER BY destination, downstream_key LIMIT $1) d \
     GROUP BY destination";

/// The planner's estimate of the delivered history: its row count (`pg_class.reltuples`, -1 when
/// never analysed) and the most common destinations with their frequencies (`pg_stats`), as
/// ANALYZE (autovacuum) last sampled them. Reads the catalogue only.
const STATS_DELIVERED_ESTIMATE: &str = "SELECT c.reltuples::float8, \
         s.most_common_vals::text::text[], s.most_common_freqs::float8[] \
     FROM pg_class c \
     LEFT JOIN pg_stats s ON s.schemaname = c.relnamespace::regnamespace::text \
         AND s.tablename = c.relname AND s.attname = 'destination' \
     WHERE c.oid = 'txoutbox_delivered'::regclass";

/// Relay attempts that finished in the last $1 seconds, by destination: all of them, and those
/// that failed (`retry`, `failed`, `expired`, `unknown`). Operator actions, leases given back at
/// shutdown and outcomes that came after the lease was lost are not attempts with an outcome.
/// Attempts carry their destination (migration V3): the recent ones are read through the BRIN
/// index on `finished_at` alone. Attempts logged before V3 have none; theirs is looked up by
/// message id (a primary-key probe each, never a scan of the history).
const STATS_ATTEMPTS: &str = "SELECT destination, sum(n)::int8, sum(f)::int8 FROM ( \
     SELECT a.destination, count(*) AS n, count(*) FILTER (WHERE a.outcome <> 'delivered') AS f \
     FROM txoutbox_attempts a \
     WHERE a.finished_at > now() - make_interval(secs => $1) AND a.destination IS NOT NULL \
       AND a.outcome IN ('delivered', 'retry', 'failed', 'expired', 'unknown') \
     GROUP BY 1 \
     UNION ALL \
     SELECT COALESCE( \
             (SELECT m.destination FROM txoutbox_messages m WHERE m.id = a.message_id), \
             (SELECT x.destination FROM txoutbox_discarded x WHERE x.id = a.message_id), \
             (SELECT d.destination FROM txoutbox_delivered d WHERE d.id = a.message_id), \
             '(purged)'), \
         count(*), count(*) FILTER (WHERE a.outcome <> 'delivered') \
     FROM txoutbox_attempt_log a \
     WHERE a.finished_at > now() - make_interval(secs => $1) AND a.destination IS NULL \
       AND a.outcome IN ('delivered', 'retry', 'failed', 'expired', 'unknown') \
     GROUP BY 1) s \
 GROUP BY destination";

/// Rows of one destination and status.
pub(crate) struct Group {
    pub(crate) destination: String,
    pub(crate) status: MessageStatus,
    pub(crate) count: i64,
    /// Seconds since the group's oldest row was enqueued (where read).
    pub(crate) oldest_age: Option<f64>,
}

/// Where [`groups`] reads.
pub(crate) enum Groups {
    /// Hot rows, reading at most this many ([`STATS_COUNTS`]).
    Counted(i64),
    /// Pending rows from a sample of this percent of the pages ([`STATS_HOT_SAMPLE`]).
    Sampled(f32),
    /// In-flight, failed and unknown rows ([`STATS_HOT_FEW`]).
    Few,
    /// Discarded rows ([`STATS_DISCARDED`]).
    Discarded,
}

/// Rows by destination and status.
pub(crate) async fn groups(
    client: &impl GenericClient,
    groups: Groups,
) -> Result<Vec<Group>, AdminError> {
    let rows = match groups {
        Groups::Counted(bound) => {
            client
                .query_typed(STATS_COUNTS, &[(&bound, Type::INT8)])
                .await?
        }
        Groups::Sampled(percent) => {
            client
                .query_typed(STATS_HOT_SAMPLE, &[(&percent, Type::FLOAT4)])
                .await?
        }
        Groups::Few => client.query_typed(STATS_HOT_FEW, &[]).await?,
        Groups::Discarded => client.query_typed(STATS_DISCARDED, &[]).await?,
    };
    rows.iter().map(group).collect()
}

fn group(row: &Row) -> Result<Group, AdminError> {
    Ok(Group {
        destination: row.try_get(0)?,
        status: row.try_get::<_, String>(1)?.parse()?,
        count: row.try_get(2)?,
        oldest_age: row.try_get(3)?,
    })
}

/// The hot table's size as the planner saw it ([`STATS_HOT_TUPLES`]).
pub(crate) async fn hot_tuples(client: &impl GenericClient) -> Result<f64, AdminError> {
    Ok(client
        .query_typed_one(STATS_HOT_TUPLES, &[])
        .await?
        .try_get(0)?)
}

/// Seconds since the oldest pending row was enqueued ([`STATS_OLDEST_PENDING`]).
pub(crate) async fn oldest_pending(client: &impl GenericClient) -> Result<Option<f64>, AdminError> {
    Ok(client
        .query_typed_one(STATS_OLDEST_PENDING, &[])
        .await?
        .try_get(0)?)
}

/// Keys carrying effects not fanned out yet, up to `bound`, and the oldest one's age in seconds
/// ([`STATS_FAN_OUT`]).
pub(crate) async fn awaiting_fan_out(
    client: &impl GenericClient,
    bound: i64,
) -> Result<(i64, Option<f64>), AdminError> {
    let row = client
        .query_typed_one(STATS_FAN_OUT, &[(&bound, Type::INT8)])
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// Delivered rows by destination, reading at most `bound` ([`STATS_DELIVERED_EXACT`]).
pub(crate) async fn delivered_counts(
    client: &impl GenericClient,
    bound: i64,
) -> Result<Vec<(String, i64)>, AdminError> {
    client
        .query_typed(STATS_DELIVERED_EXACT, &[(&bound, Type::INT8)])
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// The planner's estimate of the delivered history ([`STATS_DELIVERED_ESTIMATE`]).
pub(crate) struct DeliveredEstimate {
    pub(crate) tuples: f64,
    pub(crate) destinations: Option<Vec<String>>,
    pub(crate) frequencies: Option<Vec<f64>>,
}

/// Reads the planner's estimate of the delivered history.
pub(crate) async fn delivered_estimate(
    client: &impl GenericClient,
) -> Result<DeliveredEstimate, AdminError> {
    let row = client
        .query_typed_one(STATS_DELIVERED_ESTIMATE, &[])
        .await?;
    Ok(DeliveredEstimate {
        tuples: row.try_get(0)?,
        destinations: row.try_get(1)?,
        frequencies: row.try_get(2)?,
    })
}

/// Relay attempts of the last `window` seconds, by destination: (destination, attempts, failed)
/// ([`STATS_ATTEMPTS`]).
pub(crate) async fn attempts(
    client: &impl GenericClient,
    window: f64,
) -> Result<Vec<(String, i64, i64)>, AdminError> {
    client
        .query_typed(STATS_ATTEMPTS, &[(&window, Type::FLOAT8)])
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect()
}

/// Inbox records, expired ones and given-up ones, each counted up to `bound` ([`STATS_INBOX`]).
pub(crate) async fn inbox(
    client: &impl GenericClient,
    bound: i64,
) -> Result<(i64, i64, i64), AdminError> {
    let row = client
        .query_typed_one(STATS_INBOX, &[(&bound, Type::INT8)])
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}
