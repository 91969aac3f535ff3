//! `txoutbox discard`: failed (or unknown) rows closed without delivery, with a reason.

use anyhow::Result;
use clap::{Args, ValueEnum};
use tokio_postgres::Client;
use txoutbox::admin::{DiscardOptions, MessageStatus};

use super::{confirmed, dash, report_text, ActionArgs};

pub(super) const DISCARD_HELP: &str = "\
A discarded row is closed without delivery: it leaves the outbox for the discarded history, its
attempt log records the discard with your --reason, and the next row of its ordering key is
delivered at once (a dead-lettered head no longer blocks its key). Only failed and unknown rows
are discarded; by filter, failed rows unless --status unknown. Discarding more than
--max-without-confirm rows needs --yes.

Examples:
  txoutbox discard 0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f --reason 'customer refunded by hand'
  txoutbox discard --destination stripe --since 1h --reason 'card test data' --dry-run
  txoutbox discard --status unknown --destination sms --reason 'sent, checked with the carrier' --yes";

/// The states a discard by filter can select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiscardStatusArg {
    /// Dead-lettered rows (the default).
    Failed,
    /// At-most-once rows whose outcome was lost.
    Unknown,
}

impl From<DiscardStatusArg> for MessageStatus {
    fn from(status: DiscardStatusArg) -> Self {
        match status {
            DiscardStatusArg::Failed => MessageStatus::Failed,
            DiscardStatusArg::Unknown => MessageStatus::Unknown,
        }
    }
}

/// Options of `txoutbox discard`.
#[derive(Debug, Args)]
pub struct DiscardArgs {
    /// The rows: ids, or what the filters select.
    #[command(flatten)]
    rows: ActionArgs,
    /// Why the rows are closed without delivery (kept in their attempt log).
    #[arg(long, required = true)]
    reason: String,
    /// Which rows a discard by filter takes: failed (default) or unknown.
    #[arg(long, value_enum)]
    status: Option<DiscardStatusArg>,
}

/// `txoutbox discard`: discards the selection (or says what it would) and lists the rows.
pub(super) async fn run(client: &mut Client, args: DiscardArgs, out: &mut String) -> Result<()> {
    let options = DiscardOptions {
        dry_run: args.rows.dry_run,
        max_rows: args.rows.max_rows(),
        ..DiscardOptions::new(args.reason)
    };
    let selection = args.rows.selection(args.status.map(Into::into));
    let report = confirmed(
        txoutbox::admin::discard(client, &selection, &options).await,
        "discarded",
    )?;
    let rows: Vec<Vec<String>> = report
        .discarded
        .iter()
        .map(|d| {
            vec![
                d.id.to_string(),
                d.from.to_string(),
                d.destination.clone(),
                dash(d.ordering_key.as_deref()),
            ]
        })
        .collect();
    let header = ["ID", "FROM", "DESTINATION", "ORDERING KEY"];
    let verb = ("discard", "discarded");
    report_text(out, verb, report.dry_run, &header, &rows, &report.skipped);
    Ok(())
}
