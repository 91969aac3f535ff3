//! What a purge counts and deletes, one bounded batch a statement.

use crate::store::statements::attempt_log::PURGE_ORPHANS_BATCH as PURGE_ORPHAN_ATTEMPTS_BATCH;
use crate::store::statements::delivered::PURGE_BATCH as PURGE_DELIVERED_BATCH;
use crate::store::statements::discarded::PURGE_BATCH as PURGE_DISCARDED_BATCH;
use crate::store::statements::messages::{PURGE_BATCH as PURGE_HOT_BATCH, PURGE_COUNTS};
use crate::store::statements::session::PURGE_CUTOFF;
use chrono::{DateTime, Utc};
use tokio_postgres::Client;

use super::{count, one, value};
use crate::admin::AdminError;
use crate::state::MessageStatus;

/// Now less `secs` seconds, by the database's clock ([`PURGE_CUTOFF`]).
pub(crate) async fn cutoff(client: &Client, secs: f64) -> Result<DateTime<Utc>, AdminError> {
    value(client, PURGE_CUTOFF, &[&secs]).await
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
    let row = one(
        client,
        PURGE_COUNTS,
        &[&c.delivered, &c.failed, &c.unknown, &c.discarded],
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
    let (statement, cutoff, status) = match doomed {
        Doomed::Delivered(cutoff) => (PURGE_DELIVERED_BATCH, cutoff, None),
        Doomed::Discarded(cutoff) => (PURGE_DISCARDED_BATCH, cutoff, None),
        Doomed::Hot(status, cutoff) => (PURGE_HOT_BATCH, cutoff, Some(status.as_str())),
    };
    let row = match status {
        // The hot table's statement takes the status first.
        Some(status) => one(client, statement, &[&status, &cutoff, &batch]).await?,
        None => one(client, statement, &[&cutoff, &batch]).await?,
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
    count(client, PURGE_ORPHAN_ATTEMPTS_BATCH, &[&cutoff, &batch]).await
}
