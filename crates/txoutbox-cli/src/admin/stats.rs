//! `txoutbox stats`: counts by status and destination, the oldest pending age, the last hour's
//! failure rate and flow control's notable destinations.

use anyhow::Result;
use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;
use tokio_postgres::Client;

use super::{age, json_line, table};

pub(super) const STATS_HELP: &str = "\
The failure rate counts the last hour's relay attempts (retry, failed, expired and unknown
outcomes against delivered ones). Above 10 000 delivered rows the delivered counts are the
planner's estimate (as of the last ANALYZE), shown as ~N (estimate): counting would scan the
history.

Examples:
  txoutbox stats
  txoutbox stats --json | jq .oldest_pending_age";

/// Options of `txoutbox stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// `txoutbox stats`: the counts table and the flow-control table, or one JSON object.
pub(super) async fn run(client: &Client, args: StatsArgs, out: &mut String) -> Result<()> {
    let stats = txoutbox::admin::stats(client).await?;
    if args.json {
        json_line(out, &stats)?;
    } else {
        stats_table(out, &stats);
        fan_out_line(out, &stats);
        inbox_line(out, &stats);
        flow_table(out, &stats.flow);
    }
    Ok(())
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

/// The requests whose effects wait on their key rows for a relay's fan-out (nothing when none
/// do: a scope without deferred effects never has any).
fn fan_out_line(out: &mut String, stats: &txoutbox::admin::OutboxStats) {
    if stats.awaiting_fan_out == 0 {
        return;
    }
    out.push_str(&format!(
        "\nAWAITING FAN-OUT: {} requests whose effects are still on their key rows (oldest {})\n",
        stats.awaiting_fan_out,
        stats
            .oldest_awaiting_fan_out_age
            .map(age)
            .unwrap_or_else(|| "-".into())
    ));
}

/// The inbox's records (nothing when there are none: a service that receives nothing).
fn inbox_line(out: &mut String, stats: &txoutbox::admin::OutboxStats) {
    let inbox = &stats.inbox;
    if inbox.records == 0 {
        return;
    }
    out.push_str(&format!(
        "\nINBOX: {}{} received messages recorded, {} expired (awaiting purge), {} given up\n",
        if inbox.capped { "at least " } else { "" },
        inbox.records,
        inbox.expired,
        inbox.failed
    ));
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
