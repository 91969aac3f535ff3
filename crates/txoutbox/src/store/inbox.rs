//! `txoutbox_inbox`: record a received message in the receiving transaction, read the record a
//! redelivery finds, prune expired records.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;

use super::driver::{Statements, StoreResult};
use super::{Result, TxExecutor};

/// Records message $2 of consumer $1, received now, for a window of $3 seconds, with outcome $5
/// (`processed`, or `failed` with the error $6). Returns a row only when the record is new.
///
/// The primary key is the lock: a concurrent delivery of the same id waits on this insert until
/// the first transaction ends (then finds its record, or, after a rollback, inserts its own). A
/// redelivery of a committed message waits for nothing and locks nothing (`DO NOTHING`), so a
/// storm of redeliveries does not queue up behind itself. The wait is bounded by $4 (a
/// `lock_timeout`, as Postgres reads it: `2000ms`): the caller's timeout is saved and ours set
/// in the values, evaluated before the insert can wait, and restored by RETURNING, or by
/// [`LOOKUP`] when no row comes back; a wait that times out aborts the transaction, and the
/// setting dies with it. Under REPEATABLE READ or SERIALIZABLE a record committed after the
/// transaction's snapshot makes Postgres refuse the insert (40001).
pub(super) const RECORD: &str = "INSERT INTO txoutbox_inbox \
     (consumer, message_id, received_at, expires_at, outcome, error) \
     VALUES ($1, $2, now(), now() + make_interval(secs => $3), \
         CASE WHEN set_config('lock_timeout', CASE WHEN set_config( \
             'txoutbox.saved_lock_timeout', current_setting('lock_timeout'), true) \
             IS NULL THEN $4 ELSE $4 END, true) IS NULL THEN $5 ELSE $5 END, $6) \
     ON CONFLICT (consumer, message_id) DO NOTHING \
     RETURNING received_at, \
         set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true)";

/// The record of message $2 of consumer $1 behind [`RECORD`] (which found one), restoring the
/// caller's lock timeout: always one row, its columns NULL when there is no record (it was
/// pruned meanwhile); `live` is false for an expired record.
pub(super) const LOOKUP: &str = "SELECT i.received_at, i.outcome, i.expires_at > now() AS live, \
     set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true) \
     FROM (SELECT 1) AS one LEFT JOIN txoutbox_inbox i ON i.consumer = $1 AND i.message_id = $2";

/// Takes over the expired record of message $2 of consumer $1 (the message is new again):
/// received now, for $3 seconds, outcome $4, error $5. No row when a concurrent delivery took it
/// over first (READ COMMITTED re-reads the row it waited for, and finds it live).
pub(super) const TAKE_OVER: &str = "UPDATE txoutbox_inbox SET received_at = now(), \
         expires_at = now() + make_interval(secs => $3), outcome = $4, error = $5 \
     WHERE consumer = $1 AND message_id = $2 AND expires_at <= now() RETURNING received_at";

/// Counts the expired records (what a purge deletes).
const COUNT_EXPIRED: &str = "SELECT count(*) FROM txoutbox_inbox WHERE expires_at <= now()";

/// A message to record.
pub struct Record<'a> {
    pub consumer: &'a str,
    pub message_id: &'a str,
    /// The window, in seconds.
    pub window_secs: f64,
    /// How long to wait for a concurrent delivery of the same id, as Postgres reads it.
    pub lock_timeout: &'a str,
    /// `processed`, or `failed` with `error`.
    pub outcome: &'a str,
    pub error: Option<&'a str>,
}

/// The row of [`LOOKUP`], decoded (by any driver): every column NULL when there is no record.
pub struct FoundRecord {
    pub received_at: Option<DateTime<Utc>>,
    pub outcome: Option<String>,
    pub live: Option<bool>,
}

/// What [`record`] found.
pub(crate) enum Recorded {
    /// The record is this transaction's, received at this time.
    New(DateTime<Utc>),
    /// A live record of another transaction's: when it was received, and its outcome.
    Found(DateTime<Utc>, String),
    /// A record stopped the insert, then was gone before it could be read (pruned), or was
    /// taken over by a concurrent delivery that committed after this one's read.
    Vanished,
}

/// Records a message ([`RECORD`]), or reads the live record that holds its id ([`LOOKUP`]), or
/// takes over an expired one ([`TAKE_OVER`]), on any driver of the write path. The error of a
/// lock timeout or a serialization failure is the database's, for the caller to read its
/// SQLSTATE.
pub(crate) async fn record(tx: &mut impl Statements, r: &Record<'_>) -> StoreResult<Recorded> {
    if let Some(received) = tx.inbox_insert(r).await? {
        return Ok(Recorded::New(received));
    }
    let Some(found) = tx.inbox_lookup(r.consumer, r.message_id).await? else {
        return Ok(Recorded::Vanished);
    };
    match (found.received_at, found.outcome, found.live) {
        (Some(received), Some(outcome), Some(true)) => Ok(Recorded::Found(received, outcome)),
        (Some(_), Some(_), Some(false)) => match tx.inbox_take_over(r).await? {
            Some(received) => Ok(Recorded::New(received)),
            None => Ok(Recorded::Vanished),
        },
        _ => Ok(Recorded::Vanished),
    }
}

/// [`RECORD`] on tokio-postgres: the time of a new record, `None` when one holds the id.
pub(crate) async fn insert(tx: &impl TxExecutor, r: &Record<'_>) -> Result<Option<DateTime<Utc>>> {
    let rows = tx
        .rows(
            RECORD,
            &[
                (&r.consumer, Type::TEXT),
                (&r.message_id, Type::TEXT),
                (&r.window_secs, Type::FLOAT8),
                (&r.lock_timeout, Type::TEXT),
                (&r.outcome, Type::TEXT),
                (&r.error, Type::TEXT),
            ],
        )
        .await?;
    rows.first().map(|row| row.try_get(0)).transpose()
}

/// [`LOOKUP`] on tokio-postgres.
pub(crate) async fn lookup(
    tx: &impl TxExecutor,
    consumer: &str,
    message_id: &str,
) -> Result<Option<FoundRecord>> {
    let rows = tx
        .rows(
            LOOKUP,
            &[(&consumer, Type::TEXT), (&message_id, Type::TEXT)],
        )
        .await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    Ok(Some(FoundRecord {
        received_at: row.try_get(0)?,
        outcome: row.try_get(1)?,
        live: row.try_get(2)?,
    }))
}

/// [`TAKE_OVER`] on tokio-postgres: the time of the record taken over, `None` when a concurrent
/// delivery took it first.
pub(crate) async fn take_over(
    tx: &impl TxExecutor,
    r: &Record<'_>,
) -> Result<Option<DateTime<Utc>>> {
    let rows = tx
        .rows(
            TAKE_OVER,
            &[
                (&r.consumer, Type::TEXT),
                (&r.message_id, Type::TEXT),
                (&r.window_secs, Type::FLOAT8),
                (&r.outcome, Type::TEXT),
                (&r.error, Type::TEXT),
            ],
        )
        .await?;
    rows.first().map(|row| row.try_get(0)).transpose()
}

/// Deletes one bounded batch ($1) of expired records, oldest first; skips records a delivery
/// holds right now.
const PRUNE_EXPIRED: &str = "DELETE FROM txoutbox_inbox WHERE (consumer, message_id) IN ( \
     SELECT consumer, message_id FROM txoutbox_inbox WHERE expires_at <= now() \
     ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING 1";

/// Deletes up to `batch` expired records; returns how many.
pub(crate) async fn prune_expired(conn: &impl TxExecutor, batch: i64) -> Result<u64> {
    let rows = conn.rows(PRUNE_EXPIRED, &[(&batch, Type::INT8)]).await?;
    Ok(rows.len() as u64)
}

/// How many records have expired ([`COUNT_EXPIRED`]).
pub(crate) async fn count_expired(conn: &impl TxExecutor) -> Result<u64> {
    let rows = conn.rows(COUNT_EXPIRED, &[]).await?;
    let n: i64 = match rows.first() {
        Some(row) => row.try_get(0)?,
        None => 0,
    };
    Ok(u64::try_from(n).unwrap_or(0))
}
