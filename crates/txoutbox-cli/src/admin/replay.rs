//! `txoutbox replay`: failed (or unknown, or delivered) rows back to pending, by id or by filter.

use anyhow::Result;
use clap::{Args, ValueEnum};
use tokio_postgres::Client;
use txoutbox::admin::{MessageStatus, ReplayOptions};

use super::{confirmed, report_text, ActionArgs, Progress};

pub(super) const REPLAY_HELP: &str = "\
A replayed row goes back to pending, due now, with 0 attempts, and keeps its downstream key
(the downstream deduplicates it) unless --new-key is given. By filter, failed rows are replayed;
unknown rows (at-most-once attempts whose outcome was lost) only with --status unknown; delivered
rows only with --include-delivered. Rows a relay is delivering right now are refused.
Replaying more than --max-without-confirm rows needs --yes.

Examples:
  txoutbox replay 0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f
  txoutbox replay --destination stripe --since 1h --dry-run
  txoutbox replay --destination stripe --since 1h --yes
  txoutbox replay --status unknown --destination sms
  txoutbox replay --new-key 0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f
  txoutbox replay --include-delivered --key order-42-receipt";

/// The states a replay by filter can select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReplayStatusArg {
    /// Dead-lettered rows (the default).
    Failed,
    /// At-most-once rows whose outcome was lost (replay only those that did not happen).
    Unknown,
    /// Delivered rows (needs --include-delivered: the effect is sent again).
    Delivered,
}

impl From<ReplayStatusArg> for MessageStatus {
    fn from(status: ReplayStatusArg) -> Self {
        match status {
            ReplayStatusArg::Failed => MessageStatus::Failed,
            ReplayStatusArg::Unknown => MessageStatus::Unknown,
            ReplayStatusArg::Delivered => MessageStatus::Delivered,
        }
    }
}

/// Options of `txoutbox replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The rows: ids, or what the filters select.
    #[command(flatten)]
    rows: ActionArgs,
    /// Which rows a replay by filter takes: failed (default), unknown, or delivered.
    #[arg(long, value_enum, requires_if("delivered", "include_delivered"))]
    status: Option<ReplayStatusArg>,
    /// Also replay delivered rows (their effect is sent again).
    #[arg(long)]
    include_delivered: bool,
    /// Give each row a fresh downstream key (for a downstream that cached the old key's answer).
    #[arg(long)]
    new_key: bool,
}

/// `txoutbox replay`: replays the selection (or says what it would) and lists the rows.
pub(super) async fn run(client: &mut Client, args: ReplayArgs, out: &mut String) -> Result<()> {
    let options = ReplayOptions {
        include_delivered: args.include_delivered,
        new_key: args.new_key,
        dry_run: args.rows.dry_run,
        max_rows: args.rows.max_rows(),
        ..ReplayOptions::default()
    };
    let selection = args.rows.selection(args.status.map(Into::into));
    let mut progress = Progress::new("replaying", options.batch_size as u64);
    let report = txoutbox::admin::replay(
        client,
        &selection,
        &options,
        Some(&mut |done, total| progress.update(done, total)),
    )
    .await;
    progress.finish();
    let report = confirmed(report, "replayed")?;
    let rows: Vec<Vec<String>> = report
        .replayed
        .iter()
        .map(|r| {
            let key = match &r.replaced_key {
                Some(old) => format!("{old} -> {}", r.downstream_key),
                None => r.downstream_key.clone(),
            };
            vec![
                r.id.to_string(),
                r.from.to_string(),
                r.destination.clone(),
                key,
            ]
        })
        .collect();
    let header = ["ID", "FROM", "DESTINATION", "DOWNSTREAM KEY"];
    let verb = ("replay", "replayed");
    report_text(out, verb, report.dry_run, &header, &rows, &report.skipped);
    Ok(())
}
