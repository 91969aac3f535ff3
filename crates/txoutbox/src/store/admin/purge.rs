//! What a purge counts and deletes, one bounded batch a statement.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::admin::AdminError;
use crate::state::MessageStatus;

/// The purge's cutoff, fixed once so that every batch and the dry run agree.
const PURGE_CUTOFF: &str = "SELECT now() - make_interval(secs => $1)";

/// What a purge would delete, with the cutoffs $1 (delivered), $2 (failed), $3 (unknown), $4
/// (discarded): the rows past their state's retention, their attempt-log rows, attempt-log rows
/// older than the delivered cutoff whose message is gone, expired keys. A failed or unknown row's
/// age is that of its last attempt-log entry (a replay starts it again), else its enqueue time.
const PURGE_COUNTS: &str = "WITH hot AS ( \
     SELECT m.id, m.status FROM txoutbox_messages m \
     WHERE (m.status = 'failed' AND m.created_at < $2 AND NOT EXISTS ( \
             SELECT 1 FROM txoutbox_attempt_log a WHERE a.message_id = m.id AND a.finished_at >= $2)) \
        OR (m.status = 'unknown' AND m.created_at < $3 AND NOT EXISTS ( \
             SELECT 1 FROM txoutbox_attempt_log a WHERE a.message_id = m.id AND a.finished_at >= $3))), \
 doomed AS ( \
     SELECT id FROM txoutbox_delivered WHERE delivered_at < $1 \
     UNION ALL SELECT id FROM hot \
     UNION ALL SELECT id FROM txoutbox_discarded WHERE discarded_at < $4) \
 SELECT \
     (SELECT count(*) FROM txoutbox_delivered WHERE delivered_at < $1), \
     (SELECT count(*) FROM hot WHERE status = 'failed'), \
     (SELECT count(*) FROM hot WHERE status = 'unknown'), \
     (SELECT count(*) FROM txoutbox_discarded WHERE discarded_at < $4), \
     (SELECT count(*) FROM txoutbox_attempts a WHERE a.message_id IN (SELECT id FROM doomed)), \
     (SELECT count(*) FROM txoutbox_attempt_log a WHERE a.finished_at < $1 \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_messages m WHERE m.id = a.message_id) \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_delivered d WHERE d.id = a.message_id) \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_discarded x WHERE x.id = a.message_id)), \
     (SELECT count(*) FROM txoutbox_idempotency_keys WHERE expires_at <= now())";

/// Deletes one batch ($2) of rows delivered before $1, oldest first, with their attempt-log rows,
/// in one statement (its own transaction). Rows a replay holds are skipped, not waited for. The
/// attempts counted are the log's rows and the delivering attempts the rows carry (V4).
const PURGE_DELIVERED_BATCH: &str = "WITH doomed AS ( \
     SELECT id FROM txoutbox_delivered WHERE delivered_at < $1 \
     ORDER BY delivered_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
 gone AS ( \
     DELETE FROM txoutbox_delivered d USING doomed WHERE d.id = doomed.id \
     RETURNING d.id, d.relay IS NOT NULL AS carried), \
 logs AS ( \
     DELETE FROM txoutbox_attempt_log a USING gone WHERE a.message_id = gone.id RETURNING 1) \
 SELECT (SELECT count(*) FROM gone), \
     (SELECT count(*) FROM logs) + (SELECT count(*) FROM gone WHERE carried)";

/// Deletes one batch ($2) of rows discarded before $1, oldest first, with their attempt-log rows.
const PURGE_DISCARDED_BATCH: &str = "WITH doomed AS ( \
     SELECT id FROM txoutbox_discarded WHERE discarded_at < $1 \
     ORDER BY discarded_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
 gone AS ( \
     DELETE FROM txoutbox_discarded d USING doomed WHERE d.id = doomed.id RETURNING d.id), \
 logs AS ( \
     DELETE FROM txoutbox_attempt_log a USING gone WHERE a.message_id = gone.id RETURNING 1) \
 SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM logs)";

/// Deletes one batch ($3) of hot rows of status $1 (`failed` or `unknown`) whose last activity is
/// older than $2, with their attempt-log rows, and ends the park of the next pending row of each
/// one's ordering key (the row ahead of it is gone: it is due at once). Rows a relay or an
/// operator holds are skipped.
const PURGE_HOT_BATCH: &str = "WITH doomed AS ( \
     SELECT m.id FROM txoutbox_messages m \
     WHERE m.status = $1 AND m.created_at < $2 AND NOT EXISTS ( \
         SELECT 1 FROM txoutbox_attempt_log a WHERE a.message_id = m.id AND a.finished_at >= $2) \
     ORDER BY m.seq LIMIT $3 FOR UPDATE SKIP LOCKED), \
 gone AS ( \
     DELETE FROM txoutbox_messages m USING doomed WHERE m.id = doomed.id AND m.status = $1 \
     RETURNING m.id, m.seq, m.ordering_key), \
 logs AS ( \
     DELETE FROM txoutbox_attempt_log a USING gone WHERE a.message_id = gone.id RETURNING 1), \
 unparked AS ( \
     UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now()) \
     FROM (SELECT DISTINCT ON (n.ordering_key) n.id FROM txoutbox_messages n \
             JOIN gone g ON n.ordering_key = g.ordering_key AND n.seq > g.seq \
             WHERE NOT EXISTS (SELECT 1 FROM doomed x WHERE x.id = n.id) \
             ORDER BY n.ordering_key, n.seq) nx \
     WHERE m.id = nx.id AND m.status = 'pending') \
 SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM logs)";

/// Deletes one batch ($2) of attempt-log rows older than $1 whose message is in no table
/// (purged before, or deleted by hand).
const PURGE_ORPHAN_ATTEMPTS_BATCH: &str =
    "DELETE FROM txoutbox_attempt_log WHERE ctid = ANY(ARRAY( \
     SELECT a.ctid FROM txoutbox_attempt_log a WHERE a.finished_at < $1 \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_messages m WHERE m.id = a.message_id) \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_delivered d WHERE d.id = a.message_id) \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_discarded x WHERE x.id = a.message_id) \
     LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING 1";

/// Now less `secs` seconds, by the database's clock ([`PURGE_CUTOFF`]).
pub(crate) async fn cutoff(client: &Client, secs: f64) -> Result<DateTime<Utc>, AdminError> {
    Ok(client
        .query_typed_one(PURGE_CUTOFF, &[(&secs, Type::FLOAT8)])
        .await?
        .try_get(0)?)
}

/// The cutoff of each state's retention.
pub(crate) struct Cutoffs {
    pub(crate) delivered: DateTime<Utc>,
    pub(crate) failed: DateTime<Utc>,
    pub(crate) unknown: DateTime<Utc>,
    pub(crate) discarded: DateTime<Utc>,
}

/// What a purge would delete ([`PURGE_COUNTS`]).
pub(crate) struct Counts {
    pub(crate) delivered: u64,
    pub(crate) failed: u64,
    pub(crate) unknown: u64,
    pub(crate) discarded: u64,
    /// Attempt-log rows of the rows deleted.
    pub(crate) attempts: u64,
    /// Attempt-log rows whose message is gone.
    pub(crate) orphans: u64,
    pub(crate) expired_keys: u64,
}

/// Counts what a purge with these cutoffs deletes.
pub(crate) async fn counts(client: &Client, c: &Cutoffs) -> Result<Counts, AdminError> {
    let row = client
        .query_typed_one(
            PURGE_COUNTS,
            &[
                (&c.delivered, Type::TIMESTAMPTZ),
                (&c.failed, Type::TIMESTAMPTZ),
                (&c.unknown, Type::TIMESTAMPTZ),
                (&c.discarded, Type::TIMESTAMPTZ),
            ],
        )
        .await?;
    let count = |i: usize| -> Result<u64, AdminError> { Ok(row.try_get::<_, i64>(i)? as u64) };
    Ok(Counts {
        delivered: count(0)?,
        failed: count(1)?,
        unknown: count(2)?,
        discarded: count(3)?,
        attempts: count(4)?,
        orphans: count(5)?,
        expired_keys: count(6)?,
    })
}

/// The rows one batch deletes.
#[derive(Clone, Copy)]
pub(crate) enum Doomed {
    /// Delivered before the cutoff ([`PURGE_DELIVERED_BATCH`]).
    Delivered(DateTime<Utc>),
    /// Discarded before the cutoff ([`PURGE_DISCARDED_BATCH`]).
    Discarded(DateTime<Utc>),
    /// Hot rows of this status idle since before the cutoff ([`PURGE_HOT_BATCH`]).
    Hot(MessageStatus, DateTime<Utc>),
}

/// Deletes one batch of at most `batch` rows with their attempt-log rows; returns (rows,
/// attempt-log rows) deleted.
pub(crate) async fn delete_batch(
    client: &Client,
    doomed: Doomed,
    batch: i64,
) -> Result<(u64, u64), AdminError> {
    let row = match doomed {
        Doomed::Delivered(cutoff) => {
            client
                .query_typed_one(
                    PURGE_DELIVERED_BATCH,
                    &[(&cutoff, Type::TIMESTAMPTZ), (&batch, Type::INT8)],
                )
                .await?
        }
        Doomed::Discarded(cutoff) => {
            client
                .query_typed_one(
                    PURGE_DISCARDED_BATCH,
                    &[(&cutoff, Type::TIMESTAMPTZ), (&batch, Type::INT8)],
                )
                .await?
        }
        Doomed::Hot(status, cutoff) => {
            client
                .query_typed_one(
                    PURGE_HOT_BATCH,
                    &[
                        (&status.as_str(), Type::TEXT),
                        (&cutoff, Type::TIMESTAMPTZ),
                        (&batch, Type::INT8),
                    ],
                )
                .await?
        }
    };
    let (rows, attempts): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    Ok((rows as u64, attempts as u64))
}

/// Deletes one batch of at most `batch` orphaned attempt-log rows older than `cutoff`
/// ([`PURGE_ORPHAN_ATTEMPTS_BATCH`]); returns how many.
pub(crate) async fn delete_orphan_attempts(
    client: &Client,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, AdminError> {
    Ok(client
        .query_typed(
            PURGE_ORPHAN_ATTEMPTS_BATCH,
            &[(&cutoff, Type::TIMESTAMPTZ), (&batch, Type::INT8)],
        )
        .await?
        .len() as u64)
}
