//! The operator's forms and the handlers they post to: replay and discard (one message, the
//! selected rows, or what a filter matches after a dry run and a confirmation), pause and resume
//! of a destination.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::{html, Markup};
use txoutbox::admin::{
    DestinationFlow, DiscardOptions, DiscardReport, ReplayOptions, ReplayReport, ReplaySelection,
};
use uuid::Uuid;

use super::{error_page, hidden_fields, layout, link, render};
use crate::auth::{Base, Principal};
use crate::query::{encode, pairs, segment, storable, FilterFields};
use crate::{Failure, Shared};

/// What the README says before a replay with a new key.
pub(super) const NEW_KEY_WARNING: &str = "A new key makes the downstream treat the message as a \
     new effect: a downstream that already performed it (and whose answer was lost) performs it \
     again. Use it only for a downstream that cached the old key's permanent error (a declined \
     card) or whose key window has passed.";

/// What a discard does, said beside its button.
pub(super) const DISCARD_NOTE: &str = "A discarded message is closed without delivery: it is not \
     sent, not replayed, and the next message of its ordering key goes out at once. The reason is \
     kept in its attempt log with your name.";

/// What a pause does, said beside its button.
const PAUSE_NOTE: &str = "No relay calls a paused destination from its next claim (within a poll \
     interval) until it is resumed: its rows stay pending and spend no attempt; calls already out \
     finish. The reason is shown here and kept in the attempt log with your name.";

/// Where a form's action sends the browser once it is done: to `Ok`'s address, or to the error
/// page.
fn back_to(base: &Base, result: Result<String, Failure>) -> Response {
    match result {
        Ok(to) => Redirect::to(&to).into_response(),
        Err(failure) => error_page(base, &failure),
    }
}

// ------------------------------------------------------------------------------------------
// Replay and discard

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
    back_to(&base, result.map(|id| format!("{}/messages/{id}", base.0)))
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
        let filter = fields.filter(&app.redaction)?;
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
    back_to(&base, result.map(|id| format!("{}/messages/{id}", base.0)))
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
        let filter = fields.filter(&app.redaction)?;
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

/// An operator's flow actions on one destination: "Resume" when paused, else "Pause…" with its
/// required reason.
pub(super) fn flow_actions(
    base: &str,
    destination: &str,
    flow: Option<&DestinationFlow>,
) -> Markup {
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

/// Pauses a destination for every relay (`reason` required; one nothing names is refused
/// unless `force`); back to the overview.
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
        app.known_destination(&client, &destination, flag(&pairs, "force"))
            .await?;
        txoutbox::admin::pause_destination(&mut client, &destination, reason, Some(&who.name))
            .await?;
        Ok(())
    }
    .await;
    back_to(&base, result.map(|()| link(&base.0, "/")))
}

/// Ends an operator's pause of a destination (one nothing names is refused unless `force`);
/// back to the overview.
pub(crate) async fn resume_destination(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
    Path(destination): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        storable("destination", &destination)?;
        let mut client = app.client().await?;
        app.known_destination(&client, &destination, flag(&pairs(&body), "force"))
            .await?;
        txoutbox::admin::resume_destination(&mut client, &destination, Some(&who.name)).await?;
        Ok(())
    }
    .await;
    back_to(&base, result.map(|()| link(&base.0, "/")))
}
