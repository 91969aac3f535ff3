//! `txoutbox purge`: rows past their state's retention, their attempt log and expired keys,
//! deleted in batches.

use anyhow::Result;
use clap::Args;
use tokio_postgres::Client;
use txoutbox::admin::{PurgeOptions, Retention};

use super::{time, Progress};

pub(super) const PURGE_HELP: &str = "\
Deletes in batches, each its own transaction, skipping rows others hold: safe while relays run.
Idempotency keys are deleted only once their own window has passed, never by --retention.

Retention is per state: delivered rows 7 days, failed, unknown and discarded rows 90 days by
default (a failed or unknown row's age counts from its last attempt); attempt-log rows go with
their message. A single duration (--retention 30d) sets the delivered rows' retention.

Examples:
  txoutbox purge --dry-run
  txoutbox purge
  txoutbox purge --retention delivered=7d,failed=90d,discarded=30d
  txoutbox purge --retention 30d --batch 5000
  txoutbox purge --retention 1d --skip-keys";

/// Options of `txoutbox purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// How long rows are kept, by state: delivered=7d,failed=90d,unknown=90d,discarded=90d (the
    /// defaults; name only those you change). A single duration sets the delivered rows'.
    #[arg(long, value_name = "STATE=DURATION,...", default_value = "delivered=7d", value_parser = parse_retention)]
    retention: Retention,
    /// Delete idempotency keys and inbox records only once their own window has passed (the
    /// default).
    #[arg(long, conflicts_with = "skip_keys")]
    key_window_expired_only: bool,
    /// Leave idempotency keys and inbox records alone.
    #[arg(long)]
    skip_keys: bool,
    /// Rows per batch (each batch is its own short transaction).
    #[arg(long, default_value_t = txoutbox::admin::DEFAULT_PRUNE_BATCH, value_parser = clap::value_parser!(i64).range(1..))]
    batch: i64,
    /// Change nothing; print what would be deleted.
    #[arg(long)]
    dry_run: bool,
}

/// `txoutbox purge`: deletes (or counts, with `--dry-run`) and prints one line of totals.
pub(super) async fn run(client: &Client, args: PurgeArgs, out: &mut String) -> Result<()> {
    let options = PurgeOptions {
        retention: args.retention,
        batch: args.batch,
        expired_keys: !args.skip_keys,
        dry_run: args.dry_run,
    };
    let mut progress = Progress::new("purging", args.batch as u64);
    let report = txoutbox::admin::purge(
        client,
        &options,
        Some(&mut |done, total| progress.update(done, total)),
    )
    .await;
    progress.finish();
    let report = report?;
    let verb = if report.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    out.push_str(&format!(
        "{verb} {} delivered rows (delivered before {}), {} failed, {} unknown and {} discarded rows, {} attempt-log rows, {} expired idempotency keys, {} expired inbox records\n",
        report.delivered,
        time(&report.cutoff),
        report.failed,
        report.unknown,
        report.discarded,
        report.attempts,
        report.expired_keys,
        report.expired_inbox
    ));
    Ok(())
}

/// `--retention`: `STATE=DURATION` pairs separated by commas (delivered, failed, unknown,
/// discarded; unnamed states keep their defaults), or one duration for delivered rows.
fn parse_retention(value: &str) -> Result<Retention, String> {
    let mut retention = Retention::default();
    if !value.contains('=') {
        retention.delivered = humantime::parse_duration(value.trim())
            .map_err(|e| format!("{value:?} is not a duration (7d, 12h): {e}"))?;
        return Ok(retention);
    }
    for part in value.split(',') {
        let (state, duration) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not STATE=DURATION (delivered=7d, failed=90d)"))?;
        let duration = humantime::parse_duration(duration.trim())
            .map_err(|e| format!("{duration:?} is not a duration (7d, 12h): {e}"))?;
        let slot = match state.trim() {
            "delivered" => &mut retention.delivered,
            "failed" => &mut retention.failed,
            "unknown" => &mut retention.unknown,
            "discarded" => &mut retention.discarded,
            other => {
                return Err(format!(
                    "{other:?} is not a state with a retention (delivered, failed, unknown, \
                     discarded)"
                ))
            }
        };
        *slot = duration;
    }
    Ok(retention)
}
