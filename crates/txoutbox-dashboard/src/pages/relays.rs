//! The relays: every relay that recorded itself in `txoutbox_relays`, alive or stale (three
//! heartbeats missed), with its last heartbeat and claim, the rows it holds, its sinks and bounds.

use axum::response::Response;
use maud::{html, Markup};
use txoutbox::admin::RelayRecord;

use super::{ago, columns, layout, render};
use crate::auth::Caller;

pub(crate) async fn relays(Caller { app, who, base }: Caller) -> Response {
    let result = async {
        let client = app.client().await?;
        let relays = txoutbox::admin::relays(&**client).await?;
        let alive = relays.iter().filter(|r| !r.stale).count();
        let stale = relays.len() - alive;
        let body = html! {
            section id="relays" data-live aria-label="Relays" {
                p class={"summary" @if alive == 0 { " alarm" }} {
                    @match alive { 0 => { "No relay alive" }, 1 => { "1 relay alive" }, n => { (n) " relays alive" } }
                    @if stale > 0 { ", " strong class="alarm" { (stale) " stale" } }
                    "."
                }
                @if relays.is_empty() {
                    p { "No relay has recorded itself: none has run against this database since it was migrated, or every one exited cleanly." }
                } @else {
                    table class="relays" {
                        thead { tr {
                            (columns(&["State", "Relay", "Version", "Started", "Last heartbeat", "Last claim", "Held", "Sinks", "Bounds"], &["Held"]))
                        } }
                        tbody {
                            @for r in &relays { (row(r)) }
                        }
                    }
                }
                p class="note" {
                    "A relay refreshes its row every heartbeat and deletes it at a clean exit. "
                    "Stale: three heartbeats missed (killed, its machine lost, or cut off from the database); "
                    "its leases expire and other relays take its rows. Stale rows are pruned a day later."
                }
            }
        };
        Ok(layout(&base, &who, "Relays", "/relays", body))
    }
    .await;
    render(&base, result)
}

fn row(r: &RelayRecord) -> Markup {
    html! {
        tr class=(if r.stale { "stale" } else { "alive" }) {
            td {
                @if r.stale { span class="relay stale" { "stale" } }
                @else { span class="relay alive" { "alive" } }
            }
            td class="relay-name" {
                code class="id" { (r.owner) } br;
                small { (r.host) " · pid\u{a0}" (r.pid) }
            }
            td { (r.version) }
            td { (ago(r.started_at, r.started_age_secs)) }
            td {
                (ago(r.heartbeat_at, r.heartbeat_age_secs)) br;
                small { "every " (format!("{}", humantime::format_duration(std::time::Duration::from_millis((r.heartbeat_every_secs.clamp(0.0, 1e9) * 1000.0) as u64)))) }
            }
            td {
                @match (r.last_claim_at, r.last_claim_age_secs) {
                    (Some(at), Some(secs)) => (ago(at, secs)),
                    _ => span class="muted" { "none yet" },
                }
            }
            td class="num" { (r.held) }
            td { @for (i, s) in r.sinks.iter().enumerate() { @if i > 0 { ", " } code class="id" { (s) } } }
            td { (bounds(&r.flow)) }
        }
    }
}

/// A relay's bounds: its concurrency, and each bounded destination's rate, in-flight limit and
/// semantics.
fn bounds(flow: &serde_json::Value) -> Markup {
    let concurrency = flow.get("concurrency").and_then(|v| v.as_u64());
    let batch = flow.get("batch_size").and_then(|v| v.as_u64());
    let destinations = flow.get("destinations").and_then(|v| v.as_object());
    html! {
        @if let Some(n) = concurrency { "concurrency " (n) }
        @if let Some(n) = batch { ", batch " (n) }
        @if let Some(destinations) = destinations {
            @for (name, bound) in destinations {
                br;
                small {
                    code { (name) }
                    @if let Some(rate) = bound.get("rate_per_sec").and_then(|v| v.as_f64()) { " " (rate) "/s" }
                    @if let Some(n) = bound.get("max_in_flight").and_then(|v| v.as_u64()) { " ≤" (n) " in flight" }
                    @if bound.get("at_most_once").and_then(|v| v.as_bool()) == Some(true) { " at most once" }
                }
            }
        }
    }
}
