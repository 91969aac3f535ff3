//! The operator's commands: `list`, `show`, `replay`, `discard`, `purge`, `stats`, `pause`,
//! `resume` and `relays`. Each turns
//! its flags into the core library's types, calls `txoutbox::{list_messages, show_message, replay,
//! discard, purge, stats}` and formats the answer: an aligned table for people, `--json` for
//! scripts.
//!
//! Layout: this module holds the command list, the filters `list`, `replay` and `discard` share,
//! and the output helpers (tables, times, the progress bar); each command's flags, call and
//! formatting live in its own file (`inspect` for `list` and `show`, `flow` for `pause` and
//! `resume`).

mod discard;
mod flow;
mod inspect;
mod purge;
mod relays;
mod replay;
mod stats;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use txoutbox::admin::{MessageFilter, MessageStatus, TimeBound};

/// The operator's commands (flattened into the top-level command list).
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// List outbox messages, newest first (hot rows and the delivered history).
    #[command(after_help = inspect::LIST_HELP)]
    List(inspect::ListArgs),
    /// Show one message: payload, downstream key and its full attempt history.
    #[command(after_help = inspect::SHOW_HELP)]
    Show(inspect::ShowArgs),
    /// Put failed (or unknown, or delivered) messages back to pending, by id or by filter.
    #[command(after_help = replay::REPLAY_HELP)]
    Replay(replay::ReplayArgs),
    /// Close failed (or unknown) messages without delivery, by id or by filter, with a reason.
    #[command(after_help = discard::DISCARD_HELP)]
    Discard(discard::DiscardArgs),
    /// Delete rows past their state's retention, their attempt log, expired idempotency keys and
    /// inbox records.
    #[command(after_help = purge::PURGE_HELP)]
    Purge(purge::PurgeArgs),
    /// Counts by status and destination, oldest pending age, failure rate of the last hour.
    #[command(after_help = stats::STATS_HELP)]
    Stats(stats::StatsArgs),
    /// Stop every relay from calling a destination until `resume` (its rows wait, pending).
    #[command(after_help = flow::PAUSE_HELP)]
    Pause(flow::PauseArgs),
    /// End an operator's pause of a destination: every relay calls it again at once.
    #[command(after_help = flow::PAUSE_HELP)]
    Resume(flow::ResumeArgs),
    /// The relays running against this database: alive or stale, last claim, rows held, sinks.
    #[command(after_help = relays::RELAYS_HELP)]
    Relays(relays::RelaysArgs),
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

/// Runs one operator command against the database at `url`, once its schema is the version this
/// build reads (else the line that says what to run is the error).
pub async fn run(url: &str, command: AdminCommand) -> Result<()> {
    let mut client = crate::connect(url).await?;
    txoutbox::check_schema(&client).await?;
    let mut out = String::new();
    match command {
        AdminCommand::List(args) => inspect::list(&client, args, &mut out).await?,
        AdminCommand::Show(args) => inspect::show(&client, args, &mut out).await?,
        AdminCommand::Replay(args) => replay::run(&mut client, args, &mut out).await?,
        AdminCommand::Discard(args) => discard::run(&mut client, args, &mut out).await?,
        AdminCommand::Purge(args) => purge::run(&client, args, &mut out).await?,
        AdminCommand::Stats(args) => stats::run(&client, args, &mut out).await?,
        AdminCommand::Pause(args) => flow::pause(&mut client, args, &mut out).await?,
        AdminCommand::Resume(args) => flow::resume(&mut client, args, &mut out).await?,
        AdminCommand::Relays(args) => relays::run(&client, args, &mut out).await?,
    }
    emit(&out)
}

/// Appends `value` as one line of JSON (the `--json` form of a command's output).
fn json_line(out: &mut String, value: &impl serde::Serialize) -> Result<()> {
    out.push_str(&serde_json::to_string(value)?);
    out.push('\n');
    Ok(())
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

/// What `replay` and `discard` act on: the ids given, else what the filter selects (at most
/// `limit` rows).
/// The rows a `replay` or a `discard` acts on (ids, or what the filters select), and how one of
/// many rows is confirmed.
#[derive(Debug, Args)]
pub struct ActionArgs {
    /// Message ids; without ids, the filters select the rows.
    #[arg(
        value_name = "ID",
        conflicts_with_all = ["status", "destination", "since", "until", "key", "ordering_key", "limit"]
    )]
    ids: Vec<uuid::Uuid>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Act on at most this many rows of the filter's selection (oldest first).
    #[arg(long)]
    limit: Option<u64>,
    /// Change nothing; print the rows it would change.
    #[arg(long)]
    dry_run: bool,
    /// Confirm acting on more than --max-without-confirm rows.
    #[arg(long, short = 'y')]
    yes: bool,
    /// The most rows changed without --yes.
    #[arg(long, value_name = "N", default_value_t = 10)]
    max_without_confirm: u64,
}

impl ActionArgs {
    /// The ids, or the filter's rows in `status` (the command's default when `None`).
    fn selection(&self, status: Option<MessageStatus>) -> txoutbox::admin::ReplaySelection {
        if self.ids.is_empty() {
            txoutbox::admin::ReplaySelection::Filter(self.filter.filter(status, self.limit))
        } else {
            txoutbox::admin::ReplaySelection::Ids(self.ids.clone())
        }
    }

    /// The most rows the command may act on unconfirmed: none past `--yes` or `--dry-run`.
    fn max_rows(&self) -> Option<u64> {
        (!self.yes && !self.dry_run).then_some(self.max_without_confirm)
    }
}

/// A command's result, with its refusal to act on more rows than allowed without `--yes` as the
/// one-line error it prints (`verb`: "replayed", "discarded").
fn confirmed<T>(result: Result<T, txoutbox::admin::AdminError>, verb: &str) -> Result<T> {
    match result {
        Err(txoutbox::admin::AdminError::TooMany { count, max }) => anyhow::bail!(
            "{count} messages would be {verb}, more than {max}: run again with --yes \
             to confirm (--dry-run lists them)"
        ),
        other => Ok(other?),
    }
}

/// A replay's or a discard's report: its first line ("nothing to replay", "would replay 2
/// messages", "replayed 1 message"), its rows under `header`, then the rows it skipped and why.
fn report_text(
    out: &mut String,
    (verb, done): (&str, &str),
    dry_run: bool,
    header: &[&str],
    rows: &[Vec<String>],
    skipped: &[txoutbox::admin::SkippedMessage],
) {
    let n = rows.len();
    if n == 0 {
        out.push_str(&format!("nothing to {verb}\n"));
    } else {
        let verb = if dry_run {
            format!("would {verb}")
        } else {
            done.to_owned()
        };
        out.push_str(&format!(
            "{verb} {n} message{}\n",
            if n == 1 { "" } else { "s" }
        ));
        table(out, header, rows);
    }
    for skipped in skipped {
        out.push_str(&format!("skipped {}: {}\n", skipped.id, skipped.reason));
    }
}

fn dash(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}
