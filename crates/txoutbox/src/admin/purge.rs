//! Purge: rows past their state's retention deleted, with their attempt-log rows, and expired
//! idempotency keys pruned; in bounded batches that each commit on their own, so no long lock is
//! held and a relay or a request holding a row is skipped, not waited for.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Client;

use super::{tell, AdminError};
use crate::state::MessageStatus;
use crate::store::admin as store;
use crate::store::admin::purge::{Cutoffs, Doomed};

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
    /// Also delete idempotency keys and inbox records whose own window has passed (default
    /// true). Neither is ever deleted by `retention`: a key's window is the retry contract
    /// published to clients, an inbox record's the redeliveries it turns into duplicates.
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
    /// Expired inbox records deleted ([`crate::inbox`]).
    pub expired_inbox: u64,
}

/// Deletes rows past their state's retention ([`Retention`]: delivered, failed, unknown and
/// discarded rows) with their attempt-log rows, attempt-log rows of messages already gone, and (by
/// default) expired idempotency keys and inbox records, in bounded batches that each commit on their own, so no long
/// lock is held and relays are never waited for. A failed or unknown head that is purged stops
/// blocking its ordering key: the next row is due at once. `progress`, when given, is called with
/// (rows deleted, rows to delete) after each batch.
///
/// ```
/// use txoutbox::admin::{purge, PurgeOptions};
///
/// # async fn run(client: &tokio_postgres::Client) -> Result<(), txoutbox::admin::AdminError> {
/// let report = purge(client, &PurgeOptions::default(), None).await?; // 7 days delivered, 90 the rest
/// println!("{report:?}");
/// # Ok(())
/// # }
/// # txoutbox_test_support::doc_test(|mut client| async move {
/// #     use txoutbox::admin::MessageStatus;
/// #     txoutbox_test_support::factory::message(&mut client)
/// #         .status(MessageStatus::Failed).create().await?;
/// #     run(&client).await?;
/// #     // A dead letter of today is kept for its 90 days.
/// #     assert_eq!(txoutbox_test_support::counts(&client).await?.failed, 1);
/// #     Ok(())
/// # });
/// ```
pub async fn purge(
    client: &Client,
    options: &PurgeOptions,
    mut progress: Option<&mut (dyn FnMut(u64, u64) + Send)>,
) -> Result<PurgeReport, AdminError> {
    let cutoff_of = |retention: Duration| store::purge::cutoff(client, retention.as_secs_f64());
    let r = &options.retention;
    let cutoffs = Cutoffs {
        delivered: cutoff_of(r.delivered).await?,
        failed: cutoff_of(r.failed).await?,
        unknown: cutoff_of(r.unknown).await?,
        discarded: cutoff_of(r.discarded).await?,
    };
    let counts = store::purge::counts(client, &cutoffs).await?;
    let mut report = PurgeReport {
        dry_run: options.dry_run,
        cutoff: cutoffs.delivered,
        delivered: counts.delivered,
        failed: counts.failed,
        unknown: counts.unknown,
        discarded: counts.discarded,
        attempts: counts.attempts + counts.orphans,
        expired_keys: if options.expired_keys {
            counts.expired_keys
        } else {
            0
        },
        expired_inbox: if options.expired_keys {
            crate::store::inbox::count_expired(&crate::store::Unnamed(client)).await?
        } else {
            0
        },
    };
    if options.dry_run {
        return Ok(report);
    }
    let batch = options.batch.max(1);
    let total =
        report.delivered + report.failed + report.unknown + report.discarded + counts.orphans;
    let (mut done, mut logs) = (0u64, 0u64);
    // Deletes batches of `doomed` until one comes back short; returns the rows it deleted.
    let mut drain = async |doomed: Doomed| -> Result<u64, AdminError> {
        let mut deleted = 0;
        loop {
            let (rows, attempts) = store::purge::delete_batch(client, doomed, batch).await?;
            deleted += rows;
            logs += attempts;
            done += rows;
            tell(&mut progress, done.min(total), total);
            if rows < batch as u64 {
                return Ok(deleted);
            }
        }
    };
    report.delivered = drain(Doomed::Delivered(cutoffs.delivered)).await?;
    report.discarded = drain(Doomed::Discarded(cutoffs.discarded)).await?;
    report.failed = drain(Doomed::Hot(MessageStatus::Failed, cutoffs.failed)).await?;
    report.unknown = drain(Doomed::Hot(MessageStatus::Unknown, cutoffs.unknown)).await?;
    loop {
        let rows = store::purge::delete_orphan_attempts(client, cutoffs.delivered, batch).await?;
        logs += rows;
        done += rows;
        tell(&mut progress, done.min(total), total);
        if rows < batch as u64 {
            break;
        }
    }
    report.attempts = logs;
    if report.failed + report.unknown > 0 {
        store::notify(client).await?;
    }
    if options.expired_keys {
        report.expired_keys = prune_expired_keys(client, batch).await?;
        report.expired_inbox = prune_expired_inbox(client, batch).await?;
    }
    Ok(report)
}

/// The default number of keys deleted per batch.
pub const DEFAULT_PRUNE_BATCH: i64 = 1_000;

/// Deletes expired keys, `batch` at a time, until none is left. Returns how many were deleted.
/// After a key is pruned, a request with it is new again: the key window is the retry contract.
pub async fn prune_expired_keys(client: &Client, batch: i64) -> crate::error::Result<u64> {
    let conn = crate::store::Unnamed(client);
    in_batches(batch, |batch| {
        crate::store::keys::prune_expired(&conn, batch)
    })
    .await
}

/// Deletes expired inbox records, `batch` at a time, until none is left. Returns how many were
/// deleted. After a record is pruned, a delivery of its message is new again: the consumer's
/// window is the redelivery contract ([`crate::inbox::DEFAULT_WINDOW`]).
pub async fn prune_expired_inbox(client: &Client, batch: i64) -> crate::error::Result<u64> {
    let conn = crate::store::Unnamed(client);
    in_batches(batch, |batch| {
        crate::store::inbox::prune_expired(&conn, batch)
    })
    .await
}

/// Runs `delete` (at most `batch` rows, at least 1, a call) until a call deletes fewer than
/// `batch`; returns how many were deleted in all.
async fn in_batches<F, D>(batch: i64, mut delete: D) -> crate::error::Result<u64>
where
    D: FnMut(i64) -> F,
    F: std::future::Future<Output = Result<u64, tokio_postgres::Error>>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = delete(batch).await?;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
    }
}
