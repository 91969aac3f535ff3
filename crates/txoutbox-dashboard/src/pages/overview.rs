//! The overview: rows by destination and state with their flow control, whether a relay is
//! alive, the activity of the last hour, day or week, the top failing destinations.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::RawQuery;
use axum::response::Response;
use maud::{html, Markup};
use txoutbox::admin::{DestinationFlow, MessageStatus, StatusCounts};

use super::actions::flow_actions;
use super::{age, layout, render, time};
use crate::auth::{Caller, Principal};
use crate::query::encode;
use crate::redact::Redaction;
use crate::{chart, Failure};

/// `~` before a count that is an estimate (a large backlog or history).
fn estimated(stats: &txoutbox::admin::OutboxStats, status: MessageStatus) -> &'static str {
    let estimate = match status {
        MessageStatus::Delivered => stats.delivered_estimated,
        MessageStatus::Pending => stats.hot_estimated,
        _ => false,
    };
    if estimate {
        "~"
    } else {
        ""
    }
}

/// A count's cell: red and bold when it counts rows that need an operator (failed, unknown),
/// so a non-zero one cannot pass for a zero.
fn count_class(status: MessageStatus, n: u64) -> &'static str {
    match status {
        MessageStatus::Failed | MessageStatus::Unknown if n > 0 => "num alarm",
        _ => "num",
    }
}

/// The span of the overview's charts (`?window=1h`, `24h`, `7d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Window {
    Hour,
    Day,
    Week,
}

impl Window {
    const ALL: [Window; 3] = [Window::Hour, Window::Day, Window::Week];

    /// The `window` of a query string (the last one given); 1 h without one.
    fn from_query(query: Option<&str>) -> Result<Self, Failure> {
        let given = query
            .map(|q| crate::query::pairs(q.as_bytes()))
            .unwrap_or_default()
            .into_iter()
            .rev()
            .find(|(name, _)| name == "window");
        match given.as_ref().map(|(_, v)| v.as_str()) {
            None | Some("1h") => Ok(Window::Hour),
            Some("24h") => Ok(Window::Day),
            Some("7d") => Ok(Window::Week),
            Some(_) => Err(Failure::BadRequest(
                "window: expected 1h, 24h or 7d".to_owned(),
            )),
        }
    }

    fn param(self) -> &'static str {
        match self {
            Window::Hour => "1h",
            Window::Day => "24h",
            Window::Week => "7d",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Window::Hour => "1 h",
            Window::Day => "24 h",
            Window::Week => "7 d",
        }
    }

    /// Its buckets: how many, how wide, what one is called, how a tick names its start.
    fn buckets(self) -> (u32, Duration, &'static str, &'static str) {
        match self {
            Window::Hour => (60, Duration::from_secs(60), "minute", "%H:%M"),
            Window::Day => (96, Duration::from_secs(15 * 60), "15 min", "%H:%M"),
            Window::Week => (168, Duration::from_secs(60 * 60), "hour", "%a %H:%M"),
        }
    }
}

pub(crate) async fn overview(
    Caller { app, who, base }: Caller,
    RawQuery(query): RawQuery,
) -> Response {
    let result = async {
        let window = Window::from_query(query.as_deref())?;
        let client = app.client().await?;
        let mut stats = txoutbox::admin::stats(&**client).await?;
        stats.flow = shown_flow(&app.redaction, stats.flow);
        let (buckets, width, _, _) = window.buckets();
        let minutes = txoutbox::admin::activity_buckets(&**client, buckets, width).await?;
        let relays = txoutbox::admin::relays(&**client).await?;
        let b = &base.0;
        let body = html! {
            (backlog(b, &who, &stats, &relays))
            (activity(b, window, &minutes))
            (failing(b, &stats))
        };
        Ok(layout(&base, &who, "Overview", "/", body))
    }
    .await;
    render(&base, result)
}

/// Rows by destination and state, with each destination's flow control (and its actions for
/// an operator), the oldest pending row and whether a relay is alive.
fn backlog(
    b: &str,
    who: &Principal,
    stats: &txoutbox::admin::OutboxStats,
    relays: &[txoutbox::admin::RelayRecord],
) -> Markup {
    // Every destination with rows, and those flow control holds back without any (a pause
    // set before the first row, or kept after the last).
    let flows: BTreeMap<&str, &DestinationFlow> = stats
        .flow
        .iter()
        .map(|f| (f.destination.as_str(), f))
        .collect();
    let no_rows = StatusCounts::default();
    let mut rows: BTreeMap<&str, (&StatusCounts, Option<Duration>)> = stats
        .destinations
        .iter()
        .map(|d| (d.destination.as_str(), (&d.counts, d.oldest_pending_age)))
        .collect();
    for destination in flows.keys() {
        rows.entry(destination).or_insert((&no_rows, None));
    }
    html! {
        section id="backlog" data-live aria-labelledby="backlog-h" {
            (relay_warning(b, stats, relays))
            h2 id="backlog-h" { "Rows by destination and state" }
            p {
                "Oldest pending row: "
                strong {
                    @match stats.oldest_pending_age {
                        Some(d) => (age(d)),
                        None => "none pending",
                    }
                }
            }
            @if stats.awaiting_fan_out > 0 {
                p {
                    "Requests whose effects wait on their key rows for a relay's fan-out: "
                    strong { (stats.awaiting_fan_out) }
                    @if let Some(d) = stats.oldest_awaiting_fan_out_age { " (oldest " (age(d)) ")" }
                }
            }
            @if stats.hot_estimated || stats.delivered_estimated {
                p class="note" { "Counts marked ~ are estimates: the table is too large to count at each look." }
            }
            table {
                thead {
                    tr {
                        th scope="col" { "Destination" }
                        @for s in MessageStatus::ALL { th scope="col" class="num" { (s.as_str()) } }
                        th scope="col" class="num" { "oldest pending" }
                        th scope="col" { "flow control" }
                        @if who.may_act() { th scope="col" { "action" } }
                    }
                }
                tbody {
                    @for (destination, (counts, oldest)) in &rows {
                        @let flow = flows.get(destination).copied();
                        tr {
                            th scope="row" {
                                a href={(b) "/messages?" (encode([("destination", *destination)]))} { (destination) }
                            }
                            @for s in MessageStatus::ALL {
                                td class=(count_class(s, counts.get(s))) {
                                    a href={(b) "/messages?" (encode([("destination", *destination), ("status", s.as_str())]))} { (estimated(stats, s)) (counts.get(s)) }
                                }
                            }
                            td class="num" { @if let Some(a) = oldest { (age(*a)) } }
                            td { @if let Some(f) = flow { (flow_state(f)) } }
                            @if who.may_act() { td { (flow_actions(b, destination, flow)) } }
                        }
                    }
                }
                tfoot {
                    tr {
                        th scope="row" { "All" }
                        @for s in MessageStatus::ALL { td class=(count_class(s, stats.total.get(s))) { (estimated(stats, s)) (stats.total.get(s)) } }
                        td {}
                        td {}
                        @if who.may_act() { td {} }
                    }
                }
            }
        }
    }
}

/// The five destinations with the most failed rows, then failed attempts in the last hour.
fn failing(b: &str, stats: &txoutbox::admin::OutboxStats) -> Markup {
    let mut failing: Vec<_> = stats
        .destinations
        .iter()
        .filter(|d| d.counts.failed > 0 || d.last_hour.failures > 0)
        .collect();
    failing.sort_by(|x, y| {
        (y.counts.failed, y.last_hour.failures).cmp(&(x.counts.failed, x.last_hour.failures))
    });
    failing.truncate(5);
    html! {
        section id="failing" data-live aria-labelledby="failing-h" {
            h2 id="failing-h" { "Top failing destinations" }
            @if failing.is_empty() {
                p { "No failed rows, no failed attempts in the last hour." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Destination" }
                        th scope="col" class="num" { "failed rows" }
                        th scope="col" class="num" { "failed attempts (1 h)" }
                        th scope="col" class="num" { "failure rate (1 h)" }
                    } }
                    tbody {
                        @for d in &failing {
                            tr {
                                th scope="row" { a href={(b) "/messages?" (encode([("status", "failed"), ("destination", d.destination.as_str())]))} { (d.destination) } }
                                td class=(count_class(MessageStatus::Failed, d.counts.failed)) { (d.counts.failed) }
                                td class="num" { (d.last_hour.failures) " of " (d.last_hour.attempts) }
                                td class="num" { @if let Some(r) = d.last_hour.rate { (format!("{:.1} %", r * 100.0)) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The charts of `window`: deliveries, failed attempts and latency a bucket, with the choice of
/// window. Refreshed live over the last hour only (the longer ones read a day or a week).
fn activity(b: &str, window: Window, buckets: &[txoutbox::admin::MinuteActivity]) -> Markup {
    let (_, _, per, format) = window.buckets();
    let starts: Vec<_> = buckets.iter().map(|m| m.minute).collect();
    let time = chart::TimeAxis {
        starts: &starts,
        format,
    };
    let delivered: Vec<u64> = buckets.iter().map(|m| m.delivered).collect();
    let failed: Vec<u64> = buckets.iter().map(|m| m.failed).collect();
    let p50: Vec<Option<f64>> = buckets.iter().map(|m| m.latency_p50).collect();
    let p99: Vec<Option<f64>> = buckets.iter().map(|m| m.latency_p99).collect();
    html! {
        section id="activity" data-live[window == Window::Hour] aria-labelledby="activity-h" {
            h2 id="activity-h" { "The last " (window.name()) }
            nav class="window" aria-label="Chart span" {
                @for w in Window::ALL {
                    @if w == window { a href={(b) "?window=" (w.param())} aria-current="true" { (w.name()) } }
                    @else { a href={(b) "?window=" (w.param())} { (w.name()) } }
                }
                span class="note" { " Times in UTC, one bar a " (per) "." }
            }
            div class="charts" {
                figure {
                    (chart::bars(&format!("Delivered per {per}"), &delivered, "ok", &time, per))
                    figcaption { "Delivered per " (per) ": " (delivered.iter().sum::<u64>()) " in " (window.name()) }
                }
                figure {
                    (chart::bars(&format!("Failed attempts per {per}"), &failed, "bad", &time, per))
                    figcaption { "Failed attempts per " (per) ": " (failed.iter().sum::<u64>()) " in " (window.name()) }
                }
                figure {
                    (chart::latency("Delivery latency p50 and p99", &p50, &p99, &time))
                    figcaption { "Delivery latency (enqueue to delivery), " span class="p50" { "p50" } " and " span class="p99" { "p99" } }
                }
            }
        }
    }
}

/// The alarm when rows wait and no relay is alive to deliver them (every relay stale, or none
/// ever recorded); a line saying how many relays are alive otherwise.
fn relay_warning(
    b: &str,
    stats: &txoutbox::admin::OutboxStats,
    relays: &[txoutbox::admin::RelayRecord],
) -> Markup {
    let alive = relays.iter().filter(|r| !r.stale).count();
    let stale = relays.len() - alive;
    let waiting = stats.total.pending + stats.total.in_flight + stats.awaiting_fan_out;
    html! {
        @if alive == 0 && waiting > 0 {
            p class="alarm banner" role="alert" {
                strong { "No relay is alive" }
                " while " (waiting) " row(s) wait for delivery"
                @if stale > 0 { " (" (stale) " relay(s) stopped sending heartbeats)" }
                ": nothing is being delivered. "
                a href={(b) "/relays"} { "See the relays" }
            }
        } @else {
            p class="note" {
                a href={(b) "/relays"} {
                    @match alive { 0 => { "No relay alive" }, 1 => { "1 relay alive" }, n => { (n) " relays alive" } }
                }
                @if stale > 0 { ", " span class="alarm" { (stale) " stale" } }
            }
        }
    }
}

/// Flow-control states as the browser may see them: their reasons scrubbed (a breaker's reason
/// is a downstream's error text; a pause's, an operator's words).
pub(crate) fn shown_flow(
    redaction: &Redaction,
    flows: Vec<DestinationFlow>,
) -> Vec<DestinationFlow> {
    let scrub = redaction.shapes();
    flows
        .into_iter()
        .map(|mut f| {
            f.paused_reason = scrub.opt(f.paused_reason.as_deref());
            f.open_reason = scrub.opt(f.open_reason.as_deref());
            f
        })
        .collect()
}

/// A destination's flow-control state as the overview says it: paused by whom, since when and
/// why; the breaker open until when and why, or half-open; its rate limit and tokens.
fn flow_state(f: &DestinationFlow) -> Markup {
    html! {
        span class={"flow " (f.state)} { (f.state) }
        @match f.state.as_str() {
            "paused" => {
                " by " (f.paused_by.as_deref().unwrap_or("?"))
                @if let Some(at) = f.paused_at { " since " (time(at)) }
                @if let Some(r) = &f.paused_reason { ": " (r) }
            }
            "open" => {
                @if f.throttled { " (the downstream throttles)" } @else { " (breaker)" }
                @if let Some(at) = f.open_until { " until " (time(at)) }
                @if let Some(r) = &f.open_reason { ": " (r) }
            }
            "half_open" => " (breaker): one probe at a time",
            _ => {}
        }
        @if f.failures > 0 {
            br;
            small { (f.failures) " consecutive failure(s) counted" }
        }
        @if let Some(rate) = f.rate_per_sec {
            br;
            small { "rate limit " (rate) "/s, " (format!("{:.1}", f.tokens.unwrap_or(0.0))) " tokens" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(throttled: bool) -> DestinationFlow {
        DestinationFlow {
            destination: "x".into(),
            state: "open".into(),
            throttled,
            paused_at: None,
            paused_by: None,
            paused_reason: None,
            rate_per_sec: None,
            tokens: None,
            failures: 0,
            open_until: None,
            open_reason: Some("why".into()),
        }
    }

    #[test]
    fn an_open_destination_says_whether_its_breaker_or_the_downstream_holds_it() {
        let throttle = flow_state(&open(true)).into_string();
        assert!(
            throttle.contains("(the downstream throttles): why") && !throttle.contains("breaker"),
            "{throttle}"
        );
        let breaker = flow_state(&open(false)).into_string();
        assert!(breaker.contains("(breaker): why"), "{breaker}");
    }
}
