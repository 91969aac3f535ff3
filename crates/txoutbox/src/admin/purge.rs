//! Purge: rows past their state's retention deleted, with their attempt-log rows, and expired
//! idempotency keys pruned; in bounded batches that each commit on their own, so no long lock is
//! held and a relay or a request holding a row is skipped, not waited for.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::{sql, tell, AdminError};
use crate::sql as write_sql;

/// How long delivered rows are kept by default: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How long failed, unknown and discarded rows are kept by default: 90 days (an operator decides
/// about them, or decided, and may need to look back).
pub const DEFAULT_FAILED_RETENTION: Duration = Duration::from_secs(90 * 24 * 60 * 60);

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
            batch: DEFAULT_PRUNE_BATCH,
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

/// Deletes rows past their state's retention ([`Retention`]: delivered, failed, unknown and
/// discarded rows) with their attempt-log rows, attempt-log rows of messages already gone, and (by
/// default) expired idempotency keys, in bounded batches that each commit on their own, so no long
/// lock is held and relays are never waited for. A failed or unknown head that is purged stops
/// blocking its ordering key: the next row is due at once. `progress`, when given, is called with
/// (rows deleted, rows to delete) after each batch.
pub async fn purge(
    client: &Client,
    options: &PurgeOptions,
    mut progress: Option<&mut (dyn FnMut(u64, u64) + Send)>,
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
            tell(&mut progress, done.min(total), total);
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
        tell(&mut progress, done.min(total), total);
        if rows < batch {
            break;
        }
    }
    report.attempts = logs;
    if report.failed + report.unknown > 0 {
        client.query_typed(sql::NOTIFY, &[]).await?;
    }
    report.expired_keys = if options.expired_keys {
        prune_expired_keys(client, batch).await?
    } else {
        0
    };
    Ok(report)
}

/// The default number of keys deleted per batch.
pub const DEFAULT_PRUNE_BATCH: i64 = 1_000;

/// Deletes expired keys, `batch` at a time, until none is left. Returns how many were deleted.
/// After a key is pruned, a request with it is new again: the key window is the retry contract.
pub async fn prune_expired_keys(client: &Client, batch: i64) -> crate::Result<u64> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = client
            .query_typed(write_sql::keys::PRUNE_EXPIRED, &[(&batch, Type::INT8)])
            .await?
            .len() as u64;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
    }
}
