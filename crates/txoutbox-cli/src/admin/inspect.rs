//! `txoutbox list` and `txoutbox show`: the read-only commands, an aligned table (or text) for
//! people, `--json` for scripts.

use anyhow::Result;
use clap::{Args, ValueEnum};
use tokio_postgres::Client;
use txoutbox::admin::{AdminError, ListCursor, MessageStatus, MessageSummary, StoredJson};
use uuid::Uuid;

use super::{dash, json_line, one_line, table, time, FilterArgs};

pub(super) const LIST_HELP: &str = "\
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

pub(super) const SHOW_HELP: &str = "\
Examples:
  txoutbox show 0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f
  txoutbox show 0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f --json | jq '.history[].outcome'";

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

/// `txoutbox list`: the rows the filter selects, newest first.
pub(super) async fn list(client: &Client, args: ListArgs, out: &mut String) -> Result<()> {
    let mut filter = args
        .filter
        .filter(args.status.map(Into::into), Some(args.limit));
    filter.before = args.before;
    let rows = txoutbox::admin::list_messages(client, &filter).await?;
    if let Some(last) = rows.last().filter(|_| rows.len() as u64 == args.limit) {
        eprintln!(
            "more rows may follow: add --before {} for the next page",
            last.cursor()
        );
    }
    if args.json {
        for row in &rows {
            json_line(out, row)?;
        }
    } else {
        list_table(out, &rows);
    }
    Ok(())
}

/// `txoutbox show`: one message and its attempt history.
pub(super) async fn show(client: &Client, args: ShowArgs, out: &mut String) -> Result<()> {
    let detail = txoutbox::admin::show_message(client, args.id).await?;
    if args.json {
        json_line(out, &detail)?;
    } else {
        show_text(out, &detail)?;
    }
    Ok(())
}

/// `--before`: a list cursor, as printed after a full page.
fn parse_cursor(value: &str) -> Result<ListCursor, String> {
    value.parse().map_err(|e: AdminError| e.to_string())
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
    if m.waits_for_row_ahead {
        fields.push(("next attempt", "waits for the row ahead".to_owned()));
    } else if let Some(at) = &m.next_attempt_at {
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
    match &detail.headers {
        StoredJson::Decoded(headers) if headers.is_empty() => {}
        StoredJson::Decoded(headers) => fields.push(("headers", serde_json::to_string(headers)?)),
        StoredJson::Undecodable { text, error } => fields.push((
            "headers",
            format!("not decodable ({error}); stored: {}", one_line(text, 500)),
        )),
    }
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (name, value) in &fields {
        out.push_str(&format!("{name:<width$}  {value}\n"));
    }
    let payload = match &detail.payload {
        StoredJson::Decoded(payload) => {
            out.push_str("payload:\n");
            serde_json::to_string_pretty(payload)?
        }
        StoredJson::Undecodable { text, error } => {
            out.push_str(&format!("payload (not decodable: {error}; as stored):\n"));
            text.clone()
        }
    };
    for line in payload.lines() {
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
