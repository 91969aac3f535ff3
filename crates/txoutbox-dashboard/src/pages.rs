//! The HTML pages and the forms' actions. Everything is rendered on the server and readable
//! without script; `live.js` only refreshes the parts marked `data-live`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup, DOCTYPE};
use serde_json::Value;
use txoutbox::admin::{
    DestinationFlow, DiscardOptions, DiscardReport, MessageDetail, MessageStatus, MessageSummary,
    ReplayOptions, ReplayReport, ReplaySelection, StatusCounts,
};
use uuid::Uuid;

use crate::auth::{Base, Principal};
use crate::query::{encode, page, pairs, segment, storable, FilterFields};
use crate::redact::{is_redacted, redact, REDACTED};
use crate::{chart, Failure, Shared};

const CSS: &str = include_str!("../assets/dashboard.css");
const SCRIPT: &str = include_str!("../assets/live.js");

/// What the README says before a replay with a new key.
const NEW_KEY_WARNING: &str = "A new key makes the downstream treat the message as a new effect: \
     a downstream that already performed it (and whose answer was lost) performs it again. Use \
     it only for a downstream that cached the old key's permanent error (a declined card) or \
     whose key window has passed.";

/// What a discard does, said beside its button.
const DISCARD_NOTE: &str = "A discarded message is closed without delivery: it is not sent, not \
     replayed, and the next message of its ordering key goes out at once. The reason is kept in \
     its attempt log with your name.";

/// What a pause does, said beside its button.
const PAUSE_NOTE: &str = "No relay calls a paused destination from its next claim (within a poll \
     interval) until it is resumed: its rows stay pending and spend no attempt; calls already out \
     finish. The reason is shown here and kept in the attempt log with your name.";

pub(crate) async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

pub(crate) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

pub(crate) async fn not_found(Extension(base): Extension<Base>) -> Response {
    error_page(&base, &Failure::NotFound)
}

/// The common frame of every page.
fn layout(base: &Base, who: &Principal, title: &str, current: &str, body: Markup) -> Markup {
    let b = &base.0;
    let nav = [
        ("/", "Overview"),
        ("/messages", "Messages"),
        ("/failures", "Failures"),
        ("/keys", "Keys"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · txoutbox" }
                link rel="stylesheet" href={(b) "/assets/dashboard.css"};
                script src={(b) "/assets/live.js"} defer {}
            }
            body {
                a class="skip" href="#main" { "Skip to content" }
                header {
                    span class="brand" { "txoutbox" }
                    nav aria-label="Main" {
                        ul {
                            @for (path, name) in nav {
                                @let href = link(b, path);
                                li {
                                    @if path == current {
                                        a href=(href) aria-current="page" { (name) }
                                    } @else {
                                        a href=(href) { (name) }
                                    }
                                }
                            }
                        }
                    }
                    span class="who" { (who.name) " (" (who.role) ")" }
                }
                main id="main" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// `path` under the mount prefix `base`. The overview of a dashboard nested at `/outbox` is
/// `/outbox` (axum routes a nested `/` there, not at `/outbox/`).
fn link(base: &str, path: &str) -> String {
    if path == "/" && !base.is_empty() {
        base.to_owned()
    } else {
        format!("{base}{path}")
    }
}

fn html_response(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

fn error_page(base: &Base, failure: &Failure) -> Response {
    let status = failure.status();
    let b = &base.0;
    html_response(
        status,
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    title { (status) " · txoutbox" }
                    link rel="stylesheet" href={(b) "/assets/dashboard.css"};
                }
                body {
                    main id="main" {
                        h1 { (status) }
                        p role="alert" { (failure.to_string()) }
                        p { a href=(link(b, "/")) { "Back to the overview" } }
                    }
                }
            }
        },
    )
}

fn render(base: &Base, result: Result<Markup, Failure>) -> Response {
    match result {
        Ok(markup) => html_response(StatusCode::OK, markup),
        Err(failure) => error_page(base, &failure),
    }
}

fn time(at: DateTime<Utc>) -> Markup {
    let text = at.to_rfc3339_opts(SecondsFormat::Secs, true);
    html! { time datetime=(text) { (text) } }
}

fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn status_badge(status: MessageStatus) -> Markup {
    html! { span class={"status " (status.as_str())} { (status.as_str()) } }
}

// ------------------------------------------------------------------------------------------
// Overview

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

pub(crate) async fn overview(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
) -> Response {
    let result = async {
        let client = app.client().await?;
        let stats = txoutbox::admin::stats(&**client).await?;
        let minutes = txoutbox::admin::activity(&**client, 60).await?;
        let b = &base.0;
        let mut failing: Vec<_> = stats
            .destinations
            .iter()
            .filter(|d| d.counts.failed > 0 || d.last_hour.failures > 0)
            .collect();
        failing.sort_by(|x, y| {
            (y.counts.failed, y.last_hour.failures).cmp(&(x.counts.failed, x.last_hour.failures))
        });
        failing.truncate(5);
        let delivered: Vec<u64> = minutes.iter().map(|m| m.delivered).collect();
        let failed: Vec<u64> = minutes.iter().map(|m| m.failed).collect();
        let p50: Vec<Option<f64>> = minutes.iter().map(|m| m.latency_p50).collect();
        let p99: Vec<Option<f64>> = minutes.iter().map(|m| m.latency_p99).collect();
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
        let body = html! {
            section id="backlog" data-live aria-labelledby="backlog-h" {
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
                                    td class="num" {
                                        a href={(b) "/messages?" (encode([("destination", *destination), ("status", s.as_str())]))} { (estimated(&stats, s)) (counts.get(s)) }
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
                            @for s in MessageStatus::ALL { td class="num" { (estimated(&stats, s)) (stats.total.get(s)) } }
                            td {}
                            td {}
                            @if who.may_act() { td {} }
                        }
                    }
                }
            }
            section id="activity" data-live aria-labelledby="activity-h" {
                h2 id="activity-h" { "The last hour" }
                div class="charts" {
                    figure {
                        (chart::bars("Delivered per minute", &delivered, "ok"))
                        figcaption { "Delivered per minute: " (delivered.iter().sum::<u64>()) " in the hour" }
                    }
                    figure {
                        (chart::bars("Failed attempts per minute", &failed, "bad"))
                        figcaption { "Failed attempts per minute: " (failed.iter().sum::<u64>()) " in the hour" }
                    }
                    figure {
                        (chart::latency("Delivery latency p50 and p99", &p50, &p99))
                        figcaption { "Delivery latency (enqueue to delivery), " span class="p50" { "p50" } " and " span class="p99" { "p99" } }
                    }
                }
            }
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
                                    td class="num" { (d.counts.failed) }
                                    td class="num" { (d.last_hour.failures) " of " (d.last_hour.attempts) }
                                    td class="num" { @if let Some(r) = d.last_hour.rate { (format!("{:.1} %", r * 100.0)) } }
                                }
                            }
                        }
                    }
                }
            }
        };
        Ok(layout(&base, &who, "Overview", "/", body))
    }
    .await;
    render(&base, result)
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
                " (breaker)"
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

/// An operator's flow actions on one destination: "Resume" when paused, else "Pause…" with its
/// required reason.
fn flow_actions(base: &str, destination: &str, flow: Option<&DestinationFlow>) -> Markup {
    let action = |verb: &str| format!("{base}/destinations/{}/{verb}", segment(destination));
    html! {
        @if flow.is_some_and(|f| f.state == "paused") {
            form method="post" action=(action("resume")) {
                button type="submit" { "Resume" span class="sr" { " " (destination) } }
            }
        } @else {
            details class="pause" {
                summary { "Pause…" span class="sr" { " " (destination) } }
                form method="post" action=(action("pause")) class="actions" {
                    label { "Reason " input name="reason" required placeholder="why no relay may call it"; }
                    button type="submit" { "Pause " (destination) }
                    p class="warning" { (PAUSE_NOTE) }
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Messages

fn filter_form(base: &Base, fields: &FilterFields) -> Markup {
    let b = &base.0;
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    let status = fields.status.clone().unwrap_or_default();
    html! {
        form class="filters" method="get" action={(b) "/messages"} role="search" aria-label="Filter messages" {
            label { "State "
                select name="status" {
                    option value="" selected[status.is_empty()] { "any" }
                    @for s in MessageStatus::ALL {
                        option value=(s.as_str()) selected[status == s.as_str()] { (s.as_str()) }
                    }
                }
            }
            label { "Destination " input name="destination" value=(v(&fields.destination)); }
            label { "Since " input name="since" placeholder="2h or RFC 3339" value=(v(&fields.since)); }
            label { "Until " input name="until" placeholder="30m or RFC 3339" value=(v(&fields.until)); }
            label { "Downstream key " input name="key" value=(v(&fields.key)); }
            label { "Ordering key " input name="ordering_key" value=(v(&fields.ordering_key)); }
            label { "Error text " input name="error" value=(v(&fields.error)); }
            @if let Some(class) = &fields.error_class {
                input type="hidden" name="error_class" value=(class);
            }
            button type="submit" { "Filter" }
            a href={(b) "/messages"} { "Clear" }
        }
    }
}

fn hidden_fields(fields: &FilterFields) -> Markup {
    html! {
        @for (name, value) in fields.to_pairs() {
            input type="hidden" name=(name) value=(value);
        }
    }
}

fn message_rows(base: &Base, rows: &[MessageSummary], selectable: bool) -> Markup {
    let b = &base.0;
    html! {
        table class="messages" {
            thead { tr {
                @if selectable { th scope="col" { span class="sr" { "Select" } } }
                th scope="col" { "Id" }
                th scope="col" { "Destination" }
                th scope="col" { "State" }
                th scope="col" class="num" { "Attempts" }
                th scope="col" { "Enqueued" }
                th scope="col" { "Last error" }
                th scope="col" { "Downstream key" }
            } }
            tbody {
                @for m in rows {
                    tr data-id=(m.id) {
                        @if selectable {
                            td {
                                @if matches!(m.status, MessageStatus::Failed | MessageStatus::Unknown) {
                                    input type="checkbox" name="ids" value=(m.id) aria-label={"Select " (m.id)};
                                }
                            }
                        }
                        td { a href={(b) "/messages/" (m.id)} { code { (m.id) } } }
                        td { (m.destination) }
                        td { (status_badge(m.status)) }
                        td class="num" { (m.attempts) }
                        td { (time(m.created_at)) }
                        td class="error" { @if let Some(e) = &m.last_error { (e) } }
                        td { code { (m.downstream_key) } }
                    }
                }
            }
        }
    }
}

pub(crate) async fn messages(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    RawQuery(query): RawQuery,
) -> Response {
    let result = async {
        let pairs = pairs(query.unwrap_or_default().as_bytes());
        let fields = FilterFields::from_pairs(&pairs);
        let (cursor, limit) = page(&pairs, app.config.page_size, 500)?;
        let mut filter = fields.filter()?;
        filter.before = cursor;
        filter.limit = Some(limit + 1);
        let client = app.client().await?;
        let mut rows = txoutbox::admin::list_messages(&**client, &filter).await?;
        let more = rows.len() as u64 > limit;
        rows.truncate(limit as usize);
        let b = &base.0;
        let mut next = fields.to_pairs();
        let last = rows.last().map(|m| m.cursor().to_string());
        if let Some(last) = &last {
            next.push(("before", last.as_str()));
        }
        let limit_text = limit.to_string();
        if limit != app.config.page_size {
            next.push(("limit", limit_text.as_str()));
        }
        let first_page = encode(fields.to_pairs());
        // What a replay or a discard by this filter takes (failed rows unless it names unknown).
        let actionable = filter.status.is_none()
            || matches!(
                filter.status,
                Some(MessageStatus::Failed | MessageStatus::Unknown)
            );
        let body = html! {
            (filter_form(&base, &fields))
            // Refreshed live (paused while a row is ticked): new rows appear on the first page.
            section id="results" data-live aria-label="Messages" {
                @if rows.is_empty() {
                    p { "No message matches." }
                } @else if who.may_act() {
                    form method="post" action={(b) "/replay"} {
                        (message_rows(&base, &rows, true))
                        div class="actions" {
                            button type="submit" formnovalidate { "Replay selected" }
                            button type="submit" formnovalidate name="new_key" value="1" { "Replay selected with new keys" }
                            p class="warning" { (NEW_KEY_WARNING) }
                        }
                        div class="actions" {
                            label { "Reason " input name="reason" required placeholder="why they are closed without delivery"; }
                            button type="submit" formaction={(b) "/discard"} { "Discard selected" }
                            p class="warning" { (DISCARD_NOTE) }
                        }
                    }
                } @else {
                    (message_rows(&base, &rows, false))
                }
                nav class="pages" aria-label="Pages" {
                    @if cursor.is_some() { a href={(b) "/messages?" (first_page)} { "Newest" } }
                    @if more { a rel="next" href={(b) "/messages?" (encode(next))} { "Older" } }
                }
            }
            @if who.may_act() && actionable {
                form class="bulk" method="post" action={(b) "/replay/filter"} {
                    (hidden_fields(&fields))
                    button type="submit" { "Replay all matching this filter…" }
                    " "
                    button type="submit" formaction={(b) "/discard/filter"} { "Discard all matching this filter…" }
                    " (shows how many first, and asks to confirm)"
                }
            }
        };
        Ok(layout(&base, &who, "Messages", "/messages", body))
    }
    .await;
    render(&base, result)
}

/// A JSON value as nested `<details>`: objects and arrays collapse.
fn json_tree(value: &Value) -> Markup {
    match value {
        Value::Object(map) => html! {
            details open {
                summary { "{" (map.len()) " fields}" }
                ul class="json" {
                    @for (k, v) in map {
                        li { span class="key" { (k) ": " } (json_tree(v)) }
                    }
                }
            }
        },
        Value::Array(items) => html! {
            details open {
                summary { "[" (items.len()) " items]" }
                ol class="json" start="0" {
                    @for v in items { li { (json_tree(v)) } }
                }
            }
        },
        Value::String(s) if s == REDACTED => html! { span class="redacted" { (s) } },
        other => html! { code { (other.to_string()) } },
    }
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let _version = parts.next()?;
    let id = parts.next()?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

pub(crate) fn redacted_detail(fields: &[String], mut detail: MessageDetail) -> MessageDetail {
    redact(fields, &mut detail.payload);
    for (name, value) in detail.headers.iter_mut() {
        if is_redacted(fields, name) {
            *value = REDACTED.into();
        }
    }
    detail
}

pub(crate) async fn message(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let id = Uuid::parse_str(&id).map_err(|_| Failure::NotFound)?;
        let client = app.client().await?;
        let detail = redacted_detail(
            &app.config.redact,
            txoutbox::admin::show_message(&**client, id).await?,
        );
        let m = &detail.message;
        let b = &base.0;
        let trace = detail
            .headers
            .get("traceparent")
            .and_then(|t| trace_id(t))
            .map(str::to_owned);
        let body = html! {
            section id="summary" data-live aria-labelledby="summary-h" {
                h2 id="summary-h" { "Message" }
                dl class="fields" {
                    dt { "Id" } dd { code { (m.id) } }
                    dt { "Destination" } dd { (m.destination) }
                    dt { "State" } dd { (status_badge(m.status)) }
                    dt { "Attempts" } dd { (m.attempts) }
                    dt { "Downstream key" } dd { code { (m.downstream_key) } }
                    dt { "Ordering key" } dd { @match &m.ordering_key { Some(k) => code { (k) }, None => "none" } }
                    dt { "Enqueued" } dd { (time(m.created_at)) }
                    @if let Some(at) = m.next_attempt_at { dt { "Next attempt" } dd { (time(at)) } }
                    @if let Some(at) = m.delivered_at { dt { "Delivered" } dd { (time(at)) } }
                    @if let Some(e) = &m.last_error { dt { "Last error" } dd class="error" { (e) } }
                    @if let Some(owner) = &m.lease_owner { dt { "Lease" } dd { (owner) @if let Some(at) = m.lease_expires_at { " until " (time(at)) } } }
                    @if let Some(r) = &detail.receipt { dt { "Receipt" } dd { code { (r) } } }
                    @if let Some(t) = &trace {
                        dt { "Trace" }
                        dd {
                            @match &app.config.trace_url {
                                Some(url) => a href=(url.replace("{trace_id}", t)) { code { (t) } },
                                None => code { (t) },
                            }
                        }
                    }
                }
            }
            @if who.may_act() && matches!(m.status, MessageStatus::Failed | MessageStatus::Unknown | MessageStatus::Delivered) {
                section aria-labelledby="actions-h" {
                    h2 id="actions-h" { "Actions" }
                    form method="post" action={(b) "/messages/" (m.id) "/replay"} class="actions" {
                        @if m.status == MessageStatus::Delivered {
                            input type="hidden" name="include_delivered" value="1";
                            button type="submit" { "Deliver again (same key)" }
                            button type="submit" name="new_key" value="1" { "Deliver again with a new key" }
                        } @else {
                            button type="submit" { "Replay (same key)" }
                            button type="submit" name="new_key" value="1" { "Replay with a new key" }
                        }
                        p class="warning" { (NEW_KEY_WARNING) }
                    }
                    @if m.status != MessageStatus::Delivered {
                        details class="discard" {
                            summary { "Discard…" }
                            form method="post" action={(b) "/messages/" (m.id) "/discard"} class="actions" {
                                label { "Reason " input name="reason" required placeholder="why it is closed without delivery"; }
                                button type="submit" { "Discard without delivery" }
                                p class="warning" { (DISCARD_NOTE) }
                            }
                        }
                    }
                }
            }
            section aria-labelledby="payload-h" {
                h2 id="payload-h" { "Payload" }
                div class="tree" { (json_tree(&detail.payload)) }
            }
            section aria-labelledby="headers-h" {
                h2 id="headers-h" { "Headers" }
                @if detail.headers.is_empty() { p { "None." } } @else {
                    table { tbody {
                        @for (k, v) in &detail.headers { tr { th scope="row" { (k) } td { code { (v) } } } }
                    } }
                }
            }
            section id="attempts" data-live aria-labelledby="attempts-h" {
                h2 id="attempts-h" { "Attempts" }
                @if detail.history.is_empty() { p { "No attempt yet." } } @else {
                    table class="attempts" {
                        thead { tr {
                            th scope="col" class="num" { "#" }
                            th scope="col" { "Relay" }
                            th scope="col" { "Started" }
                            th scope="col" { "Ended" }
                            th scope="col" { "Outcome" }
                            th scope="col" { "Error or note" }
                            th scope="col" { "Receipt" }
                            th scope="col" { "Key" }
                        } }
                        tbody {
                            @for a in &detail.history {
                                tr class={"outcome " (a.outcome)} {
                                    td class="num" { (a.attempt) }
                                    td { (a.relay) }
                                    td { (time(a.started_at)) }
                                    td { (time(a.finished_at)) }
                                    td { (a.outcome) }
                                    td class="error" { @if let Some(e) = &a.error { (e) } }
                                    td { @if let Some(r) = &a.receipt { code { (r) } } }
                                    td { code { (a.downstream_key) } }
                                }
                            }
                        }
                    }
                }
            }
        };
        Ok(layout(&base, &who, &format!("Message {id}"), "/messages", body))
    }
    .await;
    render(&base, result)
}

// ------------------------------------------------------------------------------------------
// Actions

fn flag(pairs: &[(String, String)], name: &str) -> bool {
    pairs
        .iter()
        .any(|(n, v)| n == name && matches!(v.as_str(), "1" | "on" | "true"))
}

fn options(pairs: &[(String, String)], who: &Principal) -> ReplayOptions {
    ReplayOptions {
        new_key: flag(pairs, "new_key"),
        include_delivered: flag(pairs, "include_delivered"),
        operator: Some(who.name.clone()),
        ..ReplayOptions::default()
    }
}

fn report_page(base: &Base, who: &Principal, report: &ReplayReport) -> Markup {
    let b = &base.0;
    let body = html! {
        p role="status" {
            @if report.dry_run { "Would replay " } @else { "Replayed " }
            strong { (report.replayed.len()) } " message(s)"
            @if !report.skipped.is_empty() { ", skipped " strong { (report.skipped.len()) } }
            "."
        }
        @if !report.replayed.is_empty() {
            table { thead { tr { th scope="col" { "Id" } th scope="col" { "Destination" } th scope="col" { "From" } th scope="col" { "Downstream key" } } }
                tbody { @for r in &report.replayed { tr {
                    td { a href={(b) "/messages/" (r.id)} { code { (r.id) } } }
                    td { (r.destination) } td { (r.from.as_str()) }
                    td { code { (r.downstream_key) } @if let Some(old) = &r.replaced_key { " (was " code { (old) } ")" } }
                } } }
            }
        }
        @if !report.skipped.is_empty() {
            h2 { "Skipped" }
            ul { @for s in &report.skipped { li { a href={(b) "/messages/" (s.id)} { code { (s.id) } } ": " (s.reason) } } }
        }
        p { a href={(b) "/messages"} { "Back to the messages" } }
    };
    layout(base, who, "Replay", "/messages", body)
}

pub(crate) async fn replay_one(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        let id = Uuid::parse_str(&id).map_err(|_| Failure::NotFound)?;
        let pairs = pairs(&body);
        let mut client = app.client().await?;
        txoutbox::admin::replay(
            &mut client,
            &ReplaySelection::Ids(vec![id]),
            &options(&pairs, &who),
            None,
        )
        .await?;
        Ok(id)
    }
    .await;
    match result {
        Ok(id) => Redirect::to(&format!("{}/messages/{id}", base.0)).into_response(),
        Err(failure) => error_page(&base, &failure),
    }
}

pub(crate) async fn replay_selected(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    body: Bytes,
) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let ids = selected_ids(&pairs, "replay")?;
        let mut client = app.client().await?;
        let report = txoutbox::admin::replay(
            &mut client,
            &ReplaySelection::Ids(ids),
            &options(&pairs, &who),
            None,
        )
        .await?;
        Ok(report_page(&base, &who, &report))
    }
    .await;
    render(&base, result)
}

/// Replays what a filter selects: without `confirm`, a dry run that shows the count and asks;
/// with `confirm=N`, the replay, refused if more than N rows match by then.
pub(crate) async fn replay_filter(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    body: Bytes,
) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let fields = FilterFields::from_pairs(&pairs);
        let filter = fields.filter()?;
        let mut opts = options(&pairs, &who);
        let confirmed = confirmed_count(&pairs)?;
        let mut client = app.client().await?;
        let selection = ReplaySelection::Filter(filter);
        if let Some(count) = confirmed {
            opts.max_rows = Some(count);
            let report = txoutbox::admin::replay(&mut client, &selection, &opts, None).await?;
            return Ok(report_page(&base, &who, &report));
        }
        opts.dry_run = true;
        let report = txoutbox::admin::replay(&mut client, &selection, &opts, None).await?;
        let n = report.replayed.len();
        let b = &base.0;
        let body = html! {
            @if n == 0 {
                p role="status" { "No replayable message matches this filter." }
            } @else {
                p role="status" { strong { (n) } " message(s) match and would be replayed" @if opts.new_key { " with new keys" } "." }
                @if fields.is_empty() { p class="warning" { "The filter is empty: this replays every failed message." } }
                form method="post" action={(b) "/replay/filter"} class="actions" {
                    (hidden_fields(&fields))
                    input type="hidden" name="confirm" value=(n);
                    @if opts.include_delivered { input type="hidden" name="include_delivered" value="1"; }
                    button type="submit" { "Replay " (n) " message(s)" }
                    button type="submit" name="new_key" value="1" { "Replay " (n) " with new keys" }
                    p class="warning" { (NEW_KEY_WARNING) }
                }
                ul class="preview" {
                    @for r in report.replayed.iter().take(20) {
                        li { a href={(b) "/messages/" (r.id)} { code { (r.id) } } " " (r.destination) " (" (r.from.as_str()) ")" }
                    }
                    @if n > 20 { li { "… and " (n - 20) " more" } }
                }
            }
            p { a href={(b) "/messages?" (encode(fields.to_pairs()))} { "Back to the list" } }
        };
        Ok(layout(&base, &who, "Confirm the replay", "/messages", body))
    }
    .await;
    render(&base, result)
}

/// The options of a discard by `who` with the reason the form or body gave: refused (400) when
/// it is blank, before anything is read.
pub(crate) fn discard_options(
    reason: Option<&str>,
    who: &Principal,
) -> Result<DiscardOptions, Failure> {
    let reason = reason.map(str::trim).unwrap_or_default();
    if reason.is_empty() {
        return Err(Failure::BadRequest(
            "a discard needs a reason: say why the message is closed without delivery (it is kept \
             in its attempt log for the next operator)"
                .into(),
        ));
    }
    storable("reason", reason)?;
    Ok(DiscardOptions {
        operator: Some(who.name.clone()),
        ..DiscardOptions::new(reason)
    })
}

fn form_value<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn selected_ids(pairs: &[(String, String)], verb: &str) -> Result<Vec<Uuid>, Failure> {
    let ids = pairs
        .iter()
        .filter(|(n, _)| n == "ids")
        .map(|(_, v)| {
            Uuid::parse_str(v).map_err(|_| Failure::BadRequest(format!("{v:?} is not an id")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ids.is_empty() {
        return Err(Failure::BadRequest(format!(
            "no message selected: tick the rows to {verb}"
        )));
    }
    Ok(ids)
}

fn confirmed_count(pairs: &[(String, String)]) -> Result<Option<u64>, Failure> {
    form_value(pairs, "confirm")
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| Failure::BadRequest(format!("confirm {v:?} is not a count")))
        })
        .transpose()
}

fn discard_report_page(base: &Base, who: &Principal, report: &DiscardReport) -> Markup {
    let b = &base.0;
    let body = html! {
        p role="status" {
            @if report.dry_run { "Would discard " } @else { "Discarded " }
            strong { (report.discarded.len()) } " message(s)"
            @if !report.skipped.is_empty() { ", skipped " strong { (report.skipped.len()) } }
            "."
        }
        @if !report.discarded.is_empty() {
            table { thead { tr { th scope="col" { "Id" } th scope="col" { "Destination" } th scope="col" { "From" } th scope="col" { "Ordering key" } } }
                tbody { @for d in &report.discarded { tr {
                    td { a href={(b) "/messages/" (d.id)} { code { (d.id) } } }
                    td { (d.destination) } td { (d.from.as_str()) }
                    td { @if let Some(k) = &d.ordering_key { code { (k) } } }
                } } }
            }
        }
        @if !report.skipped.is_empty() {
            h2 { "Skipped" }
            ul { @for s in &report.skipped { li { a href={(b) "/messages/" (s.id)} { code { (s.id) } } ": " (s.reason) } } }
        }
        p { a href={(b) "/messages"} { "Back to the messages" } }
    };
    layout(base, who, "Discard", "/messages", body)
}

pub(crate) async fn discard_one(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        let id = Uuid::parse_str(&id).map_err(|_| Failure::NotFound)?;
        let pairs = pairs(&body);
        let options = discard_options(form_value(&pairs, "reason"), &who)?;
        let mut client = app.client().await?;
        txoutbox::admin::discard(&mut client, &ReplaySelection::Ids(vec![id]), &options).await?;
        Ok(id)
    }
    .await;
    match result {
        Ok(id) => Redirect::to(&format!("{}/messages/{id}", base.0)).into_response(),
        Err(failure) => error_page(&base, &failure),
    }
}

pub(crate) async fn discard_selected(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    body: Bytes,
) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let ids = selected_ids(&pairs, "discard")?;
        let options = discard_options(form_value(&pairs, "reason"), &who)?;
        let mut client = app.client().await?;
        let report =
            txoutbox::admin::discard(&mut client, &ReplaySelection::Ids(ids), &options).await?;
        Ok(discard_report_page(&base, &who, &report))
    }
    .await;
    render(&base, result)
}

/// Discards what a filter selects: without `confirm`, a dry run that shows the count and asks
/// for the reason; with `confirm=N` and a reason, the discard, refused if more than N rows match
/// by then.
pub(crate) async fn discard_filter(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    body: Bytes,
) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let fields = FilterFields::from_pairs(&pairs);
        let filter = fields.filter()?;
        let reason = form_value(&pairs, "reason")
            .map(str::trim)
            .filter(|r| !r.is_empty());
        let confirmed = confirmed_count(&pairs)?;
        let selection = ReplaySelection::Filter(filter);
        if let Some(count) = confirmed {
            let options = DiscardOptions {
                max_rows: Some(count),
                ..discard_options(reason, &who)?
            };
            let mut client = app.client().await?;
            let report = txoutbox::admin::discard(&mut client, &selection, &options).await?;
            return Ok(discard_report_page(&base, &who, &report));
        }
        // A dry run stores nothing: the reason is asked for with the confirmation.
        let options = DiscardOptions {
            dry_run: true,
            ..discard_options(Some(reason.unwrap_or("dry run")), &who)?
        };
        let mut client = app.client().await?;
        let report = txoutbox::admin::discard(&mut client, &selection, &options).await?;
        let n = report.discarded.len();
        let b = &base.0;
        let body = html! {
            @if n == 0 {
                p role="status" { "No discardable message (failed, or unknown when the filter names it) matches this filter." }
            } @else {
                p role="status" { strong { (n) } " message(s) match and would be discarded." }
                @if fields.is_empty() { p class="warning" { "The filter is empty: this discards every failed message." } }
                form method="post" action={(b) "/discard/filter"} class="actions" {
                    (hidden_fields(&fields))
                    input type="hidden" name="confirm" value=(n);
                    label { "Reason " input name="reason" required value=(reason.unwrap_or_default()) placeholder="why they are closed without delivery"; }
                    button type="submit" { "Discard " (n) " message(s)" }
                    p class="warning" { (DISCARD_NOTE) }
                }
                ul class="preview" {
                    @for d in report.discarded.iter().take(20) {
                        li { a href={(b) "/messages/" (d.id)} { code { (d.id) } } " " (d.destination) " (" (d.from.as_str()) ")" }
                    }
                    @if n > 20 { li { "… and " (n - 20) " more" } }
                }
            }
            p { a href={(b) "/messages?" (encode(fields.to_pairs()))} { "Back to the list" } }
        };
        Ok(layout(&base, &who, "Confirm the discard", "/messages", body))
    }
    .await;
    render(&base, result)
}

// ------------------------------------------------------------------------------------------
// Flow control

/// The reason of a pause as the form or body gave it: refused (400) when it is blank, before
/// anything is read.
pub(crate) fn pause_reason(reason: Option<&str>) -> Result<&str, Failure> {
    let reason = reason.map(str::trim).unwrap_or_default();
    if reason.is_empty() {
        return Err(Failure::BadRequest(
            "a pause needs a reason: say why no relay may call the destination (it is shown on \
             the overview and kept in the attempt log for the next operator)"
                .into(),
        ));
    }
    storable("reason", reason)?;
    Ok(reason)
}

/// Pauses a destination for every relay (`reason` required); back to the overview.
pub(crate) async fn pause_destination(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    Path(destination): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let reason = pause_reason(form_value(&pairs, "reason"))?;
        storable("destination", &destination)?;
        let mut client = app.client().await?;
        txoutbox::admin::pause_destination(&mut client, &destination, reason, Some(&who.name))
            .await?;
        Ok(())
    }
    .await;
    match result {
        Ok(()) => Redirect::to(&link(&base.0, "/")).into_response(),
        Err(failure) => error_page(&base, &failure),
    }
}

/// Ends an operator's pause of a destination; back to the overview.
pub(crate) async fn resume_destination(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    Path(destination): Path<String>,
) -> Response {
    let result = async {
        storable("destination", &destination)?;
        let mut client = app.client().await?;
        txoutbox::admin::resume_destination(&mut client, &destination, Some(&who.name)).await?;
        Ok(())
    }
    .await;
    match result {
        Ok(()) => Redirect::to(&link(&base.0, "/")).into_response(),
        Err(failure) => error_page(&base, &failure),
    }
}

// ------------------------------------------------------------------------------------------
// Failures

pub(crate) async fn failures(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
) -> Response {
    let result = async {
        let client = app.client().await?;
        let groups = txoutbox::admin::failure_groups(&**client, 200).await?;
        let b = &base.0;
        let body = html! {
            section id="groups" data-live aria-label="Failure groups" {
                @if groups.is_empty() { p { "No failed message." } } @else {
                    table class="groups" {
                        thead { tr {
                            th scope="col" { "Destination" }
                            th scope="col" { "Error (normalised)" }
                            th scope="col" class="num" { "Rows" }
                            th scope="col" { "First seen" }
                            th scope="col" { "Last seen" }
                            @if who.may_act() { th scope="col" { "Action" } }
                        } }
                        tbody {
                            @for g in &groups {
                                @let fields = FilterFields {
                                    status: Some("failed".into()),
                                    destination: Some(g.destination.clone()),
                                    error_class: Some(g.error.clone()),
                                    ..FilterFields::default()
                                };
                                tr {
                                    td { (g.destination) }
                                    td class="error" {
                                        (g.error)
                                        @if let Some(e) = &g.example { @if *e != g.error { br; small { "e.g. " (e) } } }
                                    }
                                    td class="num" { a href={(b) "/messages?" (encode(fields.to_pairs()))} { (g.count) } }
                                    td { (time(g.first_seen)) }
                                    td { (time(g.last_seen)) }
                                    @if who.may_act() {
                                        td {
                                            form method="post" action={(b) "/replay/filter"} {
                                                (hidden_fields(&fields))
                                                button type="submit" { "Replay this group…" }
                                                " "
                                                button type="submit" formaction={(b) "/discard/filter"} { "Discard this group…" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        };
        Ok(layout(&base, &who, "Failures", "/failures", body))
    }
    .await;
    render(&base, result)
}

// ------------------------------------------------------------------------------------------
// Keys

/// A stored response body as the browser may see it: JSON with the configured fields redacted,
/// else text.
pub(crate) fn shown_body(fields: &[String], body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(mut v) => {
            redact(fields, &mut v);
            serde_json::to_string_pretty(&v).unwrap_or_default()
        }
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    }
}

pub(crate) async fn keys(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    RawQuery(query): RawQuery,
) -> Response {
    let result = async {
        let pairs = pairs(query.unwrap_or_default().as_bytes());
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.trim().to_owned())
                .unwrap_or_default()
        };
        let (scope, key) = (get("scope"), get("key"));
        let b = &base.0;
        storable("scope", &scope)?;
        storable("key", &key)?;
        let found = if scope.is_empty() || key.is_empty() {
            None
        } else {
            let client = app.client().await?;
            Some(txoutbox::admin::lookup_key(&**client, &scope, &key, &app.config.effects).await?)
        };
        let body = html! {
            form class="filters" method="get" action={(b) "/keys"} role="search" aria-label="Look up a key" {
                label { "Scope " input name="scope" required value=(scope); }
                label { "Idempotency-Key " input name="key" required value=(key); }
                button type="submit" { "Look up" }
            }
            @match &found {
                None => {}
                Some(None) => p role="status" { "No key " code { (key) } " in scope " code { (scope) } " (never used, or pruned after its window)." },
                Some(Some(found)) => {
                    @let r = &found.record;
                    section aria-labelledby="key-h" {
                        h2 id="key-h" { "Key" }
                        dl class="fields" {
                            dt { "State" } dd { (r.state) @if r.expired { " (window passed: the next request with this key is new)" } }
                            dt { "Fingerprint" } dd { code { (r.fingerprint) } }
                            dt { "Claimed" } dd { (time(r.claimed_at)) }
                            dt { "Expires" } dd { (time(r.expires_at)) }
                            @if let Some(s) = r.response_status { dt { "Stored response" } dd { (s) } }
                        }
                        @if !r.response_headers.is_empty() {
                            h3 { "Response headers" }
                            table { tbody { @for (k, v) in &r.response_headers {
                                tr { th scope="row" { (k) } td { code { @if is_redacted(&app.config.redact, k) { (REDACTED) } @else { (v) } } } }
                            } } }
                        }
                        @if let Some(body) = &r.response_body {
                            details open {
                                summary { "Response body" }
                                pre { (shown_body(&app.config.redact, body)) }
                            }
                        }
                    }
                    section id="effects" data-live aria-labelledby="effects-h" {
                        h2 id="effects-h" { "Messages this request enqueued" }
                        @if found.messages.is_empty() { p { "None." } } @else { (message_rows(&base, &found.messages, false)) }
                    }
                }
            }
        };
        Ok(layout(&base, &who, "Idempotency keys", "/keys", body))
    }
    .await;
    render(&base, result)
}
