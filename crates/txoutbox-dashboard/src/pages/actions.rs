//! The operator's forms and the handlers they post to: replay and discard (one message, the
//! selected rows, or what a filter matches after a dry run and a confirmation), pause and resume
//! of a destination.

use axum::body::Bytes;
use axum::extract::Path;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{html, Markup};
use serde::de::DeserializeOwned;
use txoutbox::admin::{
    DestinationFlow, DiscardOptions, DiscardReport, DiscardedMessage, MessageStatus, ReplayOptions,
    ReplayReport, ReplaySelection, ReplayedMessage, SkippedMessage,
};
use uuid::Uuid;

use super::{error_page, hidden_fields, layout, link, render};
use crate::api::{DiscardBody, FilterBody, ReplayBody};
use crate::auth::{Base, Caller, Principal};
use crate::query::{encode, pairs, segment, storable, value, FilterFields};
use crate::{App, Failure};

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

/// The options of a discard by `who` with the reason the form or body gave: refused (400) when
/// it is blank, before anything is read.
fn discard_options(reason: Option<&str>, who: &Principal) -> Result<DiscardOptions, Failure> {
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

/// What the pages say of one of the two actions on messages, replay and discard.
struct Action {
    /// The title of the page after it.
    title: &'static str,
    /// Where a filter's confirmation posts.
    path: &'static str,
    /// The report's opening word, after the action and after a dry run of it.
    done: &'static str,
    would: &'static str,
    /// The report's last column: what a replayed row goes out under, what a discarded one frees.
    last_header: &'static str,
    nothing_matches: &'static str,
    empty_filter: &'static str,
    confirm_title: &'static str,
}

const REPLAY: Action = Action {
    title: "Replay",
    path: "/replay/filter",
    done: "Replayed ",
    would: "Would replay ",
    last_header: "Downstream key",
    nothing_matches: "No replayable message matches this filter.",
    empty_filter: "The filter is empty: this replays every failed message.",
    confirm_title: "Confirm the replay",
};

const DISCARD: Action = Action {
    title: "Discard",
    path: "/discard/filter",
    done: "Discarded ",
    would: "Would discard ",
    last_header: "Ordering key",
    nothing_matches: "No discardable message (failed, or unknown when the filter names it) \
                      matches this filter.",
    empty_filter: "The filter is empty: this discards every failed message.",
    confirm_title: "Confirm the discard",
};

/// A row of a replay's or a discard's report, as the pages show it.
trait ReportRow {
    /// Its id, destination and former state, and the cell under [`Action::last_header`].
    fn cells(&self) -> (Uuid, &str, MessageStatus, Markup);
}

impl ReportRow for ReplayedMessage {
    fn cells(&self) -> (Uuid, &str, MessageStatus, Markup) {
        let key = html! { code { (self.downstream_key) } @if let Some(old) = &self.replaced_key { " (was " code { (old) } ")" } };
        (self.id, &self.destination, self.from, key)
    }
}

impl ReportRow for DiscardedMessage {
    fn cells(&self) -> (Uuid, &str, MessageStatus, Markup) {
        let ordering_key = html! { @if let Some(k) = &self.ordering_key { code { (k) } } };
        (self.id, &self.destination, self.from, ordering_key)
    }
}

/// Replay and discard (by their options), for the handlers, the pages' and the API's, that are
/// the same for both: one message (the path's) and the selected rows.
pub(crate) trait MessageAction: Sized {
    type Report;
    /// Its body in the API.
    type Body: Default + DeserializeOwned;
    /// What its refusal of an empty selection asks to tick the rows to.
    const VERB: &'static str;
    /// The options from the form's fields, as `who`.
    fn from_form(pairs: &[(String, String)], who: &Principal) -> Result<Self, Failure>;
    /// The options from the API's body, as `who`.
    fn from_body(body: &Self::Body, who: &Principal) -> Result<Self, Failure>;
    /// The ids and the filter the API's body names (one of them, or neither: every row).
    fn named(body: &Self::Body) -> (&Option<Vec<Uuid>>, &Option<FilterBody>);
    /// Runs the action on `selection`.
    async fn run(&self, app: &App, selection: &ReplaySelection) -> Result<Self::Report, Failure>;
    /// The page after it.
    fn report(base: &Base, who: &Principal, report: &Self::Report) -> Markup;
}

impl MessageAction for ReplayOptions {
    type Report = ReplayReport;
    type Body = ReplayBody;
    const VERB: &'static str = "replay";
    fn from_form(pairs: &[(String, String)], who: &Principal) -> Result<Self, Failure> {
        Ok(options(pairs, who))
    }
    fn from_body(body: &ReplayBody, who: &Principal) -> Result<Self, Failure> {
        Ok(ReplayOptions {
            new_key: body.new_key,
            include_delivered: body.include_delivered,
            dry_run: body.dry_run,
            max_rows: body.max_rows,
            operator: Some(who.name.clone()),
            ..ReplayOptions::default()
        })
    }
    fn named(body: &ReplayBody) -> (&Option<Vec<Uuid>>, &Option<FilterBody>) {
        (&body.ids, &body.filter)
    }
    async fn run(&self, app: &App, selection: &ReplaySelection) -> Result<ReplayReport, Failure> {
        app.replay(selection, self).await
    }
    fn report(base: &Base, who: &Principal, report: &ReplayReport) -> Markup {
        let (rows, skipped) = (&report.replayed, &report.skipped);
        report_page(base, who, &REPLAY, report.dry_run, rows, skipped)
    }
}

impl MessageAction for DiscardOptions {
    type Report = DiscardReport;
    type Body = DiscardBody;
    const VERB: &'static str = "discard";
    fn from_form(pairs: &[(String, String)], who: &Principal) -> Result<Self, Failure> {
        discard_options(value(pairs, "reason"), who)
    }
    fn from_body(body: &DiscardBody, who: &Principal) -> Result<Self, Failure> {
        Ok(DiscardOptions {
            dry_run: body.dry_run,
            max_rows: body.max_rows,
            ..discard_options(body.reason.as_deref(), who)?
        })
    }
    fn named(body: &DiscardBody) -> (&Option<Vec<Uuid>>, &Option<FilterBody>) {
        (&body.ids, &body.filter)
    }
    async fn run(&self, app: &App, selection: &ReplaySelection) -> Result<DiscardReport, Failure> {
        app.discard(selection, self).await
    }
    fn report(base: &Base, who: &Principal, report: &DiscardReport) -> Markup {
        report_page(
            base,
            who,
            &DISCARD,
            report.dry_run,
            &report.discarded,
            &report.skipped,
        )
    }
}

/// Replays or discards the message of the path; back to its page.
pub(crate) async fn act_on_one<A: MessageAction>(
    Caller { app, who, base }: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        let id = Uuid::parse_str(&id).map_err(|_| Failure::NotFound)?;
        let options = A::from_form(&pairs(&body), &who)?;
        options.run(&app, &ReplaySelection::Ids(vec![id])).await?;
        Ok(id)
    }
    .await;
    back_to(&base, result.map(|id| format!("{}/messages/{id}", base.0)))
}

/// Replays or discards the rows ticked in the list; the report page.
pub(crate) async fn act_on_selected<A: MessageAction>(
    Caller { app, who, base }: Caller,
    body: Bytes,
) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let ids = selected_ids(&pairs, A::VERB)?;
        let options = A::from_form(&pairs, &who)?;
        let report = options.run(&app, &ReplaySelection::Ids(ids)).await?;
        Ok(A::report(&base, &who, &report))
    }
    .await;
    render(&base, result)
}

/// The page after a replay or a discard: what it did (or would do), row by row, and what it
/// skipped and why.
fn report_page<R: ReportRow>(
    base: &Base,
    who: &Principal,
    action: &Action,
    dry_run: bool,
    rows: &[R],
    skipped: &[SkippedMessage],
) -> Markup {
    let b = &base.0;
    let body = html! {
        p role="status" {
            @if dry_run { (action.would) } @else { (action.done) }
            strong { (rows.len()) } " message(s)"
            @if !skipped.is_empty() { ", skipped " strong { (skipped.len()) } }
            "."
        }
        @if !rows.is_empty() {
            table { thead { tr { th scope="col" { "Id" } th scope="col" { "Destination" } th scope="col" { "From" } th scope="col" { (action.last_header) } } }
                tbody { @for r in rows { @let (id, destination, from, last) = r.cells(); tr {
                    td { a href={(b) "/messages/" (id)} { code { (id) } } }
                    td { (destination) } td { (from.as_str()) }
                    td { (last) }
                } } }
            }
        }
        @if !skipped.is_empty() {
            h2 { "Skipped" }
            ul { @for s in skipped { li { a href={(b) "/messages/" (s.id)} { code { (s.id) } } ": " (s.reason) } } }
        }
        p { a href={(b) "/messages"} { "Back to the messages" } }
    };
    layout(base, who, action.title, "/messages", body)
}

/// The page a filter's dry run answers with: how many rows match (`matched` follows the
/// count), the form that confirms the action on at most that many (with its own `controls`),
/// and the first 20 rows.
fn confirm_page<R: ReportRow>(
    base: &Base,
    who: &Principal,
    action: &Action,
    fields: &FilterFields,
    rows: &[R],
    matched: Markup,
    controls: Markup,
) -> Markup {
    let n = rows.len();
    let b = &base.0;
    let body = html! {
        @if n == 0 {
            p role="status" { (action.nothing_matches) }
        } @else {
            p role="status" { strong { (n) } (matched) }
            @if fields.is_empty() { p class="warning" { (action.empty_filter) } }
            form method="post" action={(b) (action.path)} class="actions" {
                (hidden_fields(fields))
                input type="hidden" name="confirm" value=(n);
                (controls)
            }
            ul class="preview" {
                @for r in rows.iter().take(20) {
                    @let (id, destination, from, _) = r.cells();
                    li { a href={(b) "/messages/" (id)} { code { (id) } } " " (destination) " (" (from.as_str()) ")" }
                }
                @if n > 20 { li { "… and " (n - 20) " more" } }
            }
        }
        p { a href={(b) "/messages?" (encode(fields.to_pairs()))} { "Back to the list" } }
    };
    layout(base, who, action.confirm_title, "/messages", body)
}

/// Replays what a filter selects: without `confirm`, a dry run that shows the count and asks;
/// with `confirm=N`, the replay, refused if more than N rows match by then.
pub(crate) async fn replay_filter(Caller { app, who, base }: Caller, body: Bytes) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let fields = FilterFields::from_pairs(&pairs);
        let selection = ReplaySelection::Filter(fields.filter(&app.redaction)?);
        let mut opts = options(&pairs, &who);
        if let Some(count) = confirmed_count(&pairs)? {
            opts.max_rows = Some(count);
            let report = app.replay(&selection, &opts).await?;
            return Ok(ReplayOptions::report(&base, &who, &report));
        }
        opts.dry_run = true;
        let report = app.replay(&selection, &opts).await?;
        let n = report.replayed.len();
        let matched = html! { " message(s) match and would be replayed" @if opts.new_key { " with new keys" } "." };
        let controls = html! {
            @if opts.include_delivered { input type="hidden" name="include_delivered" value="1"; }
            button type="submit" { "Replay " (n) " message(s)" }
            button type="submit" name="new_key" value="1" { "Replay " (n) " with new keys" }
            p class="warning" { (NEW_KEY_WARNING) }
        };
        let rows = &report.replayed;
        Ok(confirm_page(&base, &who, &REPLAY, &fields, rows, matched, controls))
    }
    .await;
    render(&base, result)
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
    value(pairs, "confirm")
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| Failure::BadRequest(format!("confirm {v:?} is not a count")))
        })
        .transpose()
}

/// Discards what a filter selects: without `confirm`, a dry run that shows the count and asks
/// for the reason; with `confirm=N` and a reason, the discard, refused if more than N rows match
/// by then.
pub(crate) async fn discard_filter(Caller { app, who, base }: Caller, body: Bytes) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let fields = FilterFields::from_pairs(&pairs);
        let selection = ReplaySelection::Filter(fields.filter(&app.redaction)?);
        let reason = value(&pairs, "reason")
            .map(str::trim)
            .filter(|r| !r.is_empty());
        if let Some(count) = confirmed_count(&pairs)? {
            let options = DiscardOptions {
                max_rows: Some(count),
                ..discard_options(reason, &who)?
            };
            let report = app.discard(&selection, &options).await?;
            return Ok(DiscardOptions::report(&base, &who, &report));
        }
        // A dry run stores nothing: the reason is asked for with the confirmation.
        let options = DiscardOptions {
            dry_run: true,
            ..discard_options(Some(reason.unwrap_or("dry run")), &who)?
        };
        let report = app.discard(&selection, &options).await?;
        let n = report.discarded.len();
        let matched = html! { " message(s) match and would be discarded." };
        let controls = html! {
            label { "Reason " input name="reason" required value=(reason.unwrap_or_default()) placeholder="why they are closed without delivery"; }
            button type="submit" { "Discard " (n) " message(s)" }
            p class="warning" { (DISCARD_NOTE) }
        };
        let rows = &report.discarded;
        Ok(confirm_page(&base, &who, &DISCARD, &fields, rows, matched, controls))
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
    Caller { app, who, base }: Caller,
    Path(destination): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        let pairs = pairs(&body);
        let reason = pause_reason(value(&pairs, "reason"))?;
        app.pause(&destination, reason, &who, flag(&pairs, "force"))
            .await
    }
    .await;
    back_to(&base, result.map(|_| link(&base.0, "/")))
}

/// Ends an operator's pause of a destination (one nothing names is refused unless `force`);
/// back to the overview.
pub(crate) async fn resume_destination(
    Caller { app, who, base }: Caller,
    Path(destination): Path<String>,
    body: Bytes,
) -> Response {
    let force = flag(&pairs(&body), "force");
    let result = app.resume(&destination, &who, force).await;
    back_to(&base, result.map(|_| link(&base.0, "/")))
}
