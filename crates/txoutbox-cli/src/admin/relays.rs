//! `txoutbox relays`: the relays that recorded themselves, alive or stale, with their last
//! heartbeat and claim, what each holds, its sinks and bounds.

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use tokio_postgres::Client;
use txoutbox::admin::RelayRecord;

use super::{age, json_line, one_line, table};

pub(super) const RELAYS_HELP: &str = "\
Each relay records itself when it starts, refreshes its heartbeat (every 5 s by default, relay
--heartbeat) and deletes its row at a clean exit. A relay that missed three heartbeats is STALE:
killed, its machine lost, or cut off from the database; its leases expire and other relays take
its rows. Stale rows are pruned a day later. Times are by the database's clock.

Examples:
  txoutbox relays
  txoutbox relays --json | jq '[.[] | select(.stale | not)] | length'";

/// Options of `txoutbox relays`.
#[derive(Debug, Args)]
pub struct RelaysArgs {
    /// A JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// `txoutbox relays`: the table and a summary line, or a JSON array.
pub(super) async fn run(client: &Client, args: RelaysArgs, out: &mut String) -> Result<()> {
    let relays = txoutbox::admin::relays(client).await?;
    if args.json {
        json_line(out, &relays)?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = relays.iter().map(row).collect();
    if !rows.is_empty() {
        table(
            out,
            &[
                "STATE",
                "OWNER",
                "HOST",
                "PID",
                "VERSION",
                "STARTED",
                "HEARTBEAT",
                "LAST CLAIM",
                "HELD",
                "SINKS",
                "BOUNDS",
            ],
            &rows,
        );
        out.push('\n');
    }
    out.push_str(&summary(&relays));
    out.push('\n');
    Ok(())
}

fn row(r: &RelayRecord) -> Vec<String> {
    vec![
        if r.stale { "STALE" } else { "alive" }.to_owned(),
        one_line(&r.owner, 60),
        one_line(&r.host, 40),
        r.pid.to_string(),
        one_line(&r.version, 20),
        ago(Some(r.started_age_secs)),
        ago(Some(r.heartbeat_age_secs)),
        ago(r.last_claim_age_secs),
        r.held.to_string(),
        one_line(&r.sinks.join(","), 60),
        one_line(&bounds(&r.flow), 80),
    ]
}

/// `12s ago`, `3m 4s ago`; `-` for never.
fn ago(secs: Option<f64>) -> String {
    match secs {
        Some(s) if s.is_finite() && s >= 0.0 => {
            format!("{} ago", age(Duration::from_secs(s.min(1e12) as u64)))
        }
        _ => "-".to_owned(),
    }
}

/// A relay's bounds in one cell: `concurrency 64, stripe 20/s, email ≤4 in flight`.
fn bounds(flow: &serde_json::Value) -> String {
    let mut parts = Vec::new();
    if let Some(n) = flow.get("concurrency").and_then(|v| v.as_u64()) {
        parts.push(format!("concurrency {n}"));
    }
    if let Some(destinations) = flow.get("destinations").and_then(|v| v.as_object()) {
        for (name, bound) in destinations {
            let mut said = Vec::new();
            if let Some(rate) = bound.get("rate_per_sec").and_then(|v| v.as_f64()) {
                said.push(format!("{rate}/s"));
            }
            if let Some(n) = bound.get("max_in_flight").and_then(|v| v.as_u64()) {
                said.push(format!("≤{n} in flight"));
            }
            if bound.get("at_most_once").and_then(|v| v.as_bool()) == Some(true) {
                said.push("at most once".to_owned());
            }
            if !said.is_empty() {
                parts.push(format!("{name} {}", said.join(" ")));
            }
        }
    }
    parts.join(", ")
}

/// `2 relays alive, 1 stale` or `no relay alive`.
fn summary(relays: &[RelayRecord]) -> String {
    let stale = relays.iter().filter(|r| r.stale).count();
    let alive = relays.len() - stale;
    let mut line = match alive {
        0 => "no relay alive".to_owned(),
        1 => "1 relay alive".to_owned(),
        n => format!("{n} relays alive"),
    };
    if stale > 0 {
        line.push_str(&format!(", {stale} stale"));
    }
    line
}
