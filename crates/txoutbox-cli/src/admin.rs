//! The operator's commands: `list`, `show`, `replay`, `discard`, `purge`, `stats`, `pause` and
//! `resume`. Each turns
//! its flags into the core library's types, calls `txoutbox::{list_messages, show_message, replay,
//! discard, purge, stats}` and formats the answer: an aligned table for people, `--json` for
//! scripts.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use txoutbox::admin::{
    AdminError, DiscardOptions, DiscardReport, ListCursor, MessageFilter, MessageStatus,
    MessageSummary, PurgeOptions, ReplayOptions, ReplayReport, ReplaySelection, Retention,
    TimeBound,
};
use uuid::Uuid;

const LIST_HELP: &str = "\
Times (--since, --until) are a duration ago (30m, 2h, 7d) or an RFC 3339 time, compared with
the enqueue time. Delivered rows come from the delivered history (kept for the retention),
discarded ones from the discarded history. After a full page, the command prints on stderr the
--before cursor of the next page (keyset pagination: every page costs the same).

Examples:
  txoutbox list --status failed
  txoutbox list --destination email --since 2h
  txoutbox list --since 2026-01-31T00:00:00Z --until 2026-02-01T00:00:00Z --limit 500
  txoutbox list --key 5f0c9a4e-0d7e-5b1e-9d7a-1c2b3d4e5f60
  txoutbox list --ordering-key order-42 --json | jq .status
  txoutbox list --status delivered --limit 100 --before 2026-01-31T12:00:00.123456Z/4711";

const DISCARD_HELP: &str = "\
A discarded row is closed without delivery: it leaves the outbox for the discarded history, its
attempt log records the discard with your --reason, and the next row of its ordering key is
delivered at once (a dead-lettered head no longer blocks its key). Only failed and unknown rows
are discarded; by filter, failed rows unless --status unknown. Discarding more than
--max-without-confirm rows needs --yes.

Examples:
  txoutbox discard 0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f --reason 'customer refunded by hand'
  txoutbox discard --destination stripe --since 1h --reason 'card test data' --dry-run
  txoutbox discard --status unknown --destination sms --reason 'sent, checked with the carrier' --yes";

const SHOW_HELP: &str = "\
Examples:
  txoutbox show 0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f
  txoutbox show 0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f --json | jq '.history[].outcome'";

const REPLAY_HELP: &str = "\
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

const PURGE_HELP: &str = "\
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

const STATS_HELP: &str = "\
The failure rate counts the last hour's relay attempts (retry, failed, expired and unknown
outcomes against delivered ones). Above 10 000 delivered rows the delivered counts are the
planner's estimate (as of the last ANALYZE), shown as ~N (estimate): counting would scan the
history.

Examples:
  txoutbox stats
  txoutbox stats --json | jq .oldest_pending_age";

/// The operator's commands (flattened into the top-level command list).
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// List outbox messages, newest first (hot rows and the delivered history).
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// Show one message: payload, downstream key and its full attempt history.
    #[command(after_help = SHOW_HELP)]
    Show(ShowArgs),
    /// Put failed (or unknown, or delivered) messages back to pending, by id or by filter.
    #[command(after_help = REPLAY_HELP)]
    Replay(ReplayArgs),
    /// Close failed (or unknown) messages without delivery, by id or by filter, with a reason.
    #[command(after_help = DISCARD_HELP)]
    Discard(DiscardArgs),
    /// Delete rows past their state's retention, their attempt log, and expired idempotency keys.
    #[command(after_help = PURGE_HELP)]
    Purge(PurgeArgs),
    /// Counts by status and destination, oldest pending age, failure rate of the last hour.
    #[command(after_help = STATS_HELP)]
    Stats(StatsArgs),
    /// Stop every relay from calling a destination until `resume` (its rows wait, pending).
    #[command(after_help = PAUSE_HELP)]
    Pause(PauseArgs),
    /// End an operator's pause of a destination: every relay calls it again at once.
    #[command(after_help = PAUSE_HELP)]
    Resume(ResumeArgs),
}

const PAUSE_HELP: &str = "\
A pause is stored in the database: every relay obeys it at its next claim (within one poll
interval); calls already out finish. Paused rows stay pending, unleased, and spend no attempt.
Each pause and resume is logged in the attempt log under the destination, with --reason and
--by (default: $USER). `txoutbox stats` shows paused destinations and open breakers.

Examples:
  txoutbox pause stripe --reason 'Stripe incident INC-42'
  txoutbox resume stripe";

/// Options of `txoutbox pause`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The destination to pause (as the relay's sinks name it: stripe, email, webhook:orders).
    destination: String,
    /// Why (shown by `stats`, kept in the attempt log).
    #[arg(long)]
    reason: String,
    /// Who pauses it (default: $USER).
    #[arg(long)]
    by: Option<String>,
}

/// Options of `txoutbox resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The destination to resume.
    destination: String,
    /// Who resumes it (default: $USER).
    #[arg(long)]
    by: Option<String>,
}

/// Who runs the command, for the attempt log: `--by`, else `$USER`.
fn operator(by: Option<String>) -> Option<String> {
    by.or_else(|| std::env::var("USER").ok())
        .filter(|u| !u.trim().is_empty())
}

/// A message state, as the flags spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    /// Waiting for delivery.
    Pending,
    /// Leased by a relay right now.
    #[value(alias = "in_flight")]
    InFlight,
    /// Delivered (the delivered history).
    Delivered,
    /// Dead-lettered.
    Failed,
    /// At-most-once attempt whose outcome was lost.
    Unknown,
    /// Closed by an operator without delivery.
    Discarded,
}

impl From<StatusArg> for MessageStatus {
    fn from(status: StatusArg) -> Self {
        match status {
            StatusArg::Pending => MessageStatus::Pending,
            StatusArg::InFlight => MessageStatus::InFlight,
            StatusArg::Delivered => MessageStatus::Delivered,
            StatusArg::Failed => MessageStatus::Failed,
            StatusArg::Unknown => MessageStatus::Unknown,
            StatusArg::Discarded => MessageStatus::Discarded,
        }
    }
}

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

/// The filters `list`, `replay` and `discard` share.
#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Only messages to this destination (the sink's name).
    #[arg(long)]
    destination: Option<String>,
    /// Only messages enqueued at or after WHEN: a duration ago (2h, 30m, 7d) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN", value_parser = parse_time_bound)]
    since: Option<TimeBound>,
    /// Only messages enqueued before WHEN: a duration ago (2h, 30m, 7d) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN", value_parser = parse_time_bound)]
    until: Option<TimeBound>,
    /// Only messages carrying this downstream key.
    #[arg(long, value_name = "DOWNSTREAM_KEY")]
    key: Option<String>,
    /// Only messages of this ordering key.
    #[arg(long)]
    ordering_key: Option<String>,
}

impl FilterArgs {
    fn filter(&self, status: Option<MessageStatus>, limit: Option<u64>) -> MessageFilter {
        MessageFilter {
            status,
            destination: self.destination.clone(),
            since: self.since,
            until: self.until,
            downstream_key: self.key.clone(),
            ordering_key: self.ordering_key.clone(),
            limit,
            ..MessageFilter::default()
        }
    }
}

/// Options of `txoutbox list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only messages in this state.
    #[arg(long, value_enum)]
    status: Option<StatusArg>,
    #[command(flatten)]
    filter: FilterArgs,
    /// At most this many messages.
    #[arg(long, default_value_t = 50)]
    limit: u64,
    /// The next page: rows listed after this cursor (printed on stderr after a full page).
    #[arg(long, value_name = "CURSOR", value_parser = parse_cursor)]
    before: Option<ListCursor>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Options of `txoutbox show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The message id.
    id: Uuid,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of `txoutbox replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Message ids; without ids, the filters select the rows.
    #[arg(
        value_name = "ID",
        conflicts_with_all = ["status", "destination", "since", "until", "key", "ordering_key", "limit"]
    )]
    ids: Vec<Uuid>,
    /// Which rows a replay by filter takes: failed (default), unknown, or delivered.
    #[arg(long, value_enum, requires_if("delivered", "include_delivered"))]
    status: Option<ReplayStatusArg>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Replay at most this many rows of the filter's selection (oldest first).
    #[arg(long)]
    limit: Option<u64>,
    /// Also replay delivered rows (their effect is sent again).
    #[arg(long)]
    include_delivered: bool,
    /// Give each row a fresh downstream key (for a downstream that cached the old key's answer).
    #[arg(long)]
    new_key: bool,
    /// Change nothing; print what would be replayed.
    #[arg(long)]
    dry_run: bool,
    /// Confirm a replay of more than --max-without-confirm rows.
    #[arg(long, short = 'y')]
    yes: bool,
    /// The most rows replayed without --yes.
    #[arg(long, value_name = "N", default_value_t = 10)]
    max_without_confirm: u64,
}

/// Options of `txoutbox discard`.
#[derive(Debug, Args)]
pub struct DiscardArgs {
    /// Message ids; without ids, the filters select the rows.
    #[arg(
        value_name = "ID",
        conflicts_with_all = ["status", "destination", "since", "until", "key", "ordering_key", "limit"]
    )]
    ids: Vec<Uuid>,
    /// Why the rows are closed without delivery (kept in their attempt log).
    #[arg(long, required = true)]
    reason: String,
    /// Which rows a discard by filter takes: failed (default) or unknown.
    #[arg(long, value_enum)]
    status: Option<DiscardStatusArg>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Discard at most this many rows of the filter's selection (oldest first).
    #[arg(long)]
    limit: Option<u64>,
    /// Change nothing; print what would be discarded.
    #[arg(long)]
    dry_run: bool,
    /// Confirm a discard of more than --max-without-confirm rows.
    #[arg(long, short = 'y')]
    yes: bool,
    /// The most rows discarded without --yes.
    #[arg(long, value_name = "N", default_value_t = 10)]
    max_without_confirm: u64,
}

/// Options of `txoutbox purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// How long rows are kept, by state: delivered=7d,failed=90d,unknown=90d,discarded=90d (the
    /// defaults; name only those you change). A single duration sets the delivered rows'.
    #[arg(long, value_name = "STATE=DURATION,...", default_value = "delivered=7d", value_parser = parse_retention)]
    retention: Retention,
    /// Delete idempotency keys only once their own window has passed (the default).
    #[arg(long, conflicts_with = "skip_keys")]
    key_window_expired_only: bool,
    /// Leave idempotency keys alone.
    #[arg(long)]
    skip_keys: bool,
    /// Rows per batch (each batch is its own short transaction).
    #[arg(long, default_value_t = txoutbox::admin::DEFAULT_PRUNE_BATCH, value_parser = clap::value_parser!(i64).range(1..))]
    batch: i64,
    /// Change nothing; print what would be deleted.
    #[arg(long)]
    dry_run: bool,
}

/// Options of `txoutbox stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs one operator command against the database at `url`.
pub async fn run(url: &str, command: AdminCommand) -> Result<()> {
    let mut client = crate::connect(url).await?;
    let mut out = String::new();
    match command {
        AdminCommand::List(args) => {
            let mut filter = args
                .filter
                .filter(args.status.map(Into::into), Some(args.limit));
            filter.before = args.before;
            let rows = txoutbox::admin::list_messages(&client, &filter).await?;
            if let Some(last) = rows.last().filter(|_| rows.len() as u64 == args.limit) {
                eprintln!(
                    "more rows may follow: add --before {} for the next page",
                    last.cursor()
                );
            }
            if args.json {
                for row in &rows {
                    out.push_str(&serde_json::to_string(row)?);
                    out.push('\n');
                }
            } else {
                list_table(&mut out, &rows);
            }
        }
        AdminCommand::Show(args) => {
            let detail = txoutbox::admin::show_message(&client, args.id).await?;
            if args.json {
                out.push_str(&serde_json::to_string(&detail)?);
                out.push('\n');
            } else {
                show_text(&mut out, &detail)?;
            }
        }
        AdminCommand::Replay(args) => {
            let selection = if args.ids.is_empty() {
                ReplaySelection::Filter(args.filter.filter(args.status.map(Into::into), args.limit))
            } else {
                ReplaySelection::Ids(args.ids.clone())
            };
            let options = ReplayOptions {
                include_delivered: args.include_delivered,
                new_key: args.new_key,
                dry_run: args.dry_run,
                max_rows: (!args.yes && !args.dry_run).then_some(args.max_without_confirm),
                ..ReplayOptions::default()
            };
            let mut progress = Progress::new("replaying", options.batch_size as u64);
            let report = txoutbox::admin::replay(
                &mut client,
                &selection,
                &options,
                Some(&mut |done, total| progress.update(done, total)),
            )
            .await;
            progress.finish();
            let report = match report {
                Err(AdminError::TooMany { count, max }) => bail!(
                    "{count} messages would be replayed, more than {max}: run again with --yes \
                     to confirm (--dry-run lists them)"
                ),
                other => other?,
            };
            replay_text(&mut out, &report);
        }
        AdminCommand::Discard(args) => {
            let selection = if args.ids.is_empty() {
                ReplaySelection::Filter(args.filter.filter(args.status.map(Into::into), args.limit))
            } else {
                ReplaySelection::Ids(args.ids.clone())
            };
            let options = DiscardOptions {
                dry_run: args.dry_run,
                max_rows: (!args.yes && !args.dry_run).then_some(args.max_without_confirm),
                ..DiscardOptions::new(args.reason)
            };
            let report = match txoutbox::admin::discard(&mut client, &selection, &options).await {
                Err(AdminError::TooMany { count, max }) => bail!(
                    "{count} messages would be discarded, more than {max}: run again with --yes \
                     to confirm (--dry-run lists them)"
                ),
                other => other?,
            };
            discard_text(&mut out, &report);
        }
        AdminCommand::Purge(args) => {
            let options = PurgeOptions {
                retention: args.retention,
                batch: args.batch,
                expired_keys: !args.skip_keys,
                dry_run: args.dry_run,
            };
            let mut progress = Progress::new("purging", args.batch as u64);
            let report = txoutbox::admin::purge(
                &client,
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
                "{verb} {} delivered rows (delivered before {}), {} failed, {} unknown and {} discarded rows, {} attempt-log rows, {} expired idempotency keys\n",
                report.delivered,
                time(&report.cutoff),
                report.failed,
                report.unknown,
                report.discarded,
                report.attempts,
                report.expired_keys
            ));
        }
        AdminCommand::Stats(args) => {
            let stats = txoutbox::admin::stats(&client).await?;
            if args.json {
                out.push_str(&serde_json::to_string(&stats)?);
                out.push('\n');
            } else {
                stats_table(&mut out, &stats);
                flow_table(&mut out, &stats.flow);
            }
        }
        AdminCommand::Pause(args) => {
            let by = operator(args.by);
            let flow = txoutbox::admin::pause_destination(
                &mut client,
                &args.destination,
                &args.reason,
                by.as_deref(),
            )
            .await?;
            out.push_str(&format!(
                "paused {}: every relay stops calling it at its next claim (txoutbox resume {} to end)\n",
                flow.destination, flow.destination
            ));
        }
        AdminCommand::Resume(args) => {
            let by = operator(args.by);
            let flow =
                txoutbox::admin::resume_destination(&mut client, &args.destination, by.as_deref())
                    .await?;
            out.push_str(&format!("resumed {} ({})\n", flow.destination, flow.state));
        }
    }
    emit(&out)
}

/// Writes the command's output; a reader that went away (`| head`) is not an error.
fn emit(out: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the output"),
    }
}

/// `--since`/`--until`: an RFC 3339 time, or a duration meaning "that long ago".
fn parse_time_bound(value: &str) -> Result<TimeBound, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(value) {
        return Ok(TimeBound::At(at.with_timezone(&Utc)));
    }
    humantime::parse_duration(value)
        .map(TimeBound::Ago)
        .map_err(|_| {
            format!(
                "{value:?} is neither a duration ago (30m, 2h, 7d) nor an RFC 3339 time \
                 (2026-01-31T12:00:00Z)"
            )
        })
}

/// `--before`: a list cursor, as printed after a full page.
fn parse_cursor(value: &str) -> Result<ListCursor, String> {
    value.parse().map_err(|e: AdminError| e.to_string())
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

/// A progress bar for long runs, drawn only when stdout is a terminal (never into a pipe).
struct Progress {
    what: &'static str,
    enabled: bool,
    min: u64,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Shown once a run has more than `min` rows (one batch finishes before any bar would).
    fn new(what: &'static str, min: u64) -> Self {
        Self {
            what,
            enabled: std::io::stdout().is_terminal(),
            min,
            bar: None,
        }
    }

    fn update(&mut self, done: u64, total: u64) {
        if !self.enabled || total <= self.min {
            return;
        }
        let what = self.what;
        let bar = self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} {eta}") {
                bar.set_style(style);
            }
            bar.set_message(what);
            bar
        });
        bar.set_length(total);
        bar.set_position(done);
    }

    fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

fn time(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > max {
        let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

/// Appends an aligned table: columns two spaces apart, the last one unpadded.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            let pad = width.saturating_sub(cell.chars().count());
            text.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

fn dash(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}

fn list_table(out: &mut String, rows: &[MessageSummary]) {
    if rows.is_empty() {
        out.push_str("no messages match\n");
        return;
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                m.status.to_string(),
                m.destination.clone(),
                m.attempts.to_string(),
                time(&m.created_at),
                m.downstream_key.clone(),
                dash(m.ordering_key.as_deref()),
                m.last_error
                    .as_deref()
                    .map(|e| one_line(e, 60))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        out,
        &[
            "ID",
            "STATUS",
            "DESTINATION",
            "ATTEMPTS",
            "ENQUEUED",
            "DOWNSTREAM KEY",
            "ORDERING KEY",
            "LAST ERROR",
        ],
        &cells,
    );
}

fn show_text(out: &mut String, detail: &txoutbox::admin::MessageDetail) -> Result<()> {
    let m = &detail.message;
    let mut fields: Vec<(&str, String)> = vec![
        ("id", m.id.to_string()),
        ("status", m.status.to_string()),
        ("destination", m.destination.clone()),
        ("downstream key", m.downstream_key.clone()),
        ("ordering key", dash(m.ordering_key.as_deref())),
        ("attempts", m.attempts.to_string()),
        ("enqueued", time(&m.created_at)),
    ];
    if let Some(at) = &m.next_attempt_at {
        fields.push(("next attempt", time(at)));
    }
    if let Some(at) = &m.delivered_at {
        fields.push(("delivered", time(at)));
    }
    if let Some(at) = &m.discarded_at {
        fields.push(("discarded", time(at)));
    }
    if let Some(receipt) = &detail.receipt {
        fields.push(("receipt", receipt.clone()));
    }
    if let (Some(owner), Some(until)) = (&m.lease_owner, &m.lease_expires_at) {
        fields.push(("lease", format!("{owner} until {}", time(until))));
    }
    if let Some(error) = &m.last_error {
        fields.push(("last error", one_line(error, 500)));
    }
    if !detail.headers.is_empty() {
        fields.push(("headers", serde_json::to_string(&detail.headers)?));
    }
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (name, value) in &fields {
        out.push_str(&format!("{name:<width$}  {value}\n"));
    }
    out.push_str("payload:\n");
    for line in serde_json::to_string_pretty(&detail.payload)?.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!("history ({} entries):\n", detail.history.len()));
    let rows: Vec<Vec<String>> = detail
        .history
        .iter()
        .map(|a| {
            vec![
                time(&a.started_at),
                a.attempt.to_string(),
                a.outcome.to_string(),
                a.relay.clone(),
                a.downstream_key.clone(),
                a.error
                    .as_deref()
                    .or(a.receipt.as_deref())
                    .map(|t| one_line(t, 200))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let mut history = String::new();
    table(
        &mut history,
        &[
            "STARTED",
            "ATTEMPT",
            "OUTCOME",
            "RELAY",
            "DOWNSTREAM KEY",
            "DETAIL",
        ],
        &rows,
    );
    for line in history.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

fn replay_text(out: &mut String, report: &ReplayReport) {
    let n = report.replayed.len();
    if n == 0 {
        out.push_str("nothing to replay\n");
    } else {
        let verb = if report.dry_run {
            "would replay"
        } else {
            "replayed"
        };
        out.push_str(&format!(
            "{verb} {n} message{}\n",
            if n == 1 { "" } else { "s" }
        ));
        let rows: Vec<Vec<String>> = report
            .replayed
            .iter()
            .map(|r| {
                vec![
                    r.id.to_string(),
                    r.from.to_string(),
                    r.destination.clone(),
                    match &r.replaced_key {
                        Some(old) => format!("{old} -> {}", r.downstream_key),
                        None => r.downstream_key.clone(),
                    },
                ]
            })
            .collect();
        table(out, &["ID", "FROM", "DESTINATION", "DOWNSTREAM KEY"], &rows);
    }
    for skipped in &report.skipped {
        out.push_str(&format!("skipped {}: {}\n", skipped.id, skipped.reason));
    }
}

fn discard_text(out: &mut String, report: &DiscardReport) {
    let n = report.discarded.len();
    if n == 0 {
        out.push_str("nothing to discard\n");
    } else {
        let verb = if report.dry_run {
            "would discard"
        } else {
            "discarded"
        };
        out.push_str(&format!(
            "{verb} {n} message{}\n",
            if n == 1 { "" } else { "s" }
        ));
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
        table(out, &["ID", "FROM", "DESTINATION", "ORDERING KEY"], &rows);
    }
    for skipped in &report.skipped {
        out.push_str(&format!("skipped {}: {}\n", skipped.id, skipped.reason));
    }
}

/// A delivered count as `stats` prints it: `~10 000 000 (estimate)` when it is one.
fn count_cell(n: u64, estimated: bool) -> String {
    if !estimated {
        return n.to_string();
    }
    let digits = n.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(' ');
        }
        grouped.push(c);
    }
    format!("~{grouped} (estimate)")
}

/// Flow control's notable destinations under the counts (nothing when there are none).
fn flow_table(out: &mut String, flows: &[txoutbox::admin::DestinationFlow]) {
    if flows.is_empty() {
        return;
    }
    out.push_str("\nFLOW CONTROL\n");
    let rows: Vec<Vec<String>> = flows
        .iter()
        .map(|f| {
            let detail = match f.state.as_str() {
                "paused" => format!(
                    "paused by {} {}: {}",
                    f.paused_by.as_deref().unwrap_or("?"),
                    f.paused_at.map(rfc3339).unwrap_or_default(),
                    f.paused_reason.as_deref().unwrap_or("")
                ),
                "open" => format!(
                    "open until {}: {}",
                    f.open_until.map(rfc3339).unwrap_or_default(),
                    f.open_reason.as_deref().unwrap_or("")
                ),
                "half_open" => "half-open: one probe at a time".to_owned(),
                _ => String::new(),
            };
            vec![
                f.destination.clone(),
                f.state.clone(),
                f.rate_per_sec
                    .map(|r| format!("{r}/s ({:.1} tokens)", f.tokens.unwrap_or(0.0)))
                    .unwrap_or_else(|| "-".into()),
                f.failures.to_string(),
                detail,
            ]
        })
        .collect();
    table(
        out,
        &["DESTINATION", "STATE", "RATE LIMIT", "FAILURES", "DETAIL"],
        &rows,
    );
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn stats_table(out: &mut String, stats: &txoutbox::admin::OutboxStats) {
    let rate = |r: &txoutbox::admin::FailureRate| match r.rate {
        Some(rate) => format!("{:.1}% ({}/{})", rate * 100.0, r.failures, r.attempts),
        None => "-".into(),
    };
    let mut rows: Vec<Vec<String>> = Vec::new();
    let counts = |c: &txoutbox::admin::StatusCounts| {
        [
            count_cell(c.pending, stats.hot_estimated),
            c.in_flight.to_string(),
            c.failed.to_string(),
            c.unknown.to_string(),
            count_cell(c.delivered, stats.delivered_estimated),
            c.discarded.to_string(),
        ]
    };
    for d in &stats.destinations {
        let mut row = vec![d.destination.clone()];
        row.extend(counts(&d.counts));
        row.push(d.oldest_pending_age.map(age).unwrap_or_else(|| "-".into()));
        row.push(rate(&d.last_hour));
        rows.push(row);
    }
    let mut total = vec!["TOTAL".to_owned()];
    total.extend(counts(&stats.total));
    total.push(
        stats
            .oldest_pending_age
            .map(age)
            .unwrap_or_else(|| "-".into()),
    );
    total.push(rate(&stats.last_hour));
    rows.push(total);
    table(
        out,
        &[
            "DESTINATION",
            "PENDING",
            "IN_FLIGHT",
            "FAILED",
            "UNKNOWN",
            "DELIVERED",
            "DISCARDED",
            "OLDEST PENDING",
            "FAILURES (1H)",
        ],
        &rows,
    );
}
