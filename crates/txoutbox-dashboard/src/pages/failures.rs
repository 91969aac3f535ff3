//! The failures: `unknown` rows (at-most-once attempts whose outcome was lost: an operator must
//! decide) and failed (dead-lettered) rows, each grouped by destination and normalised error,
//! each group a link to its rows and, for an operator, a replay or discard of the group. The
//! error text is scrubbed by shape (the groups do not read payloads).

use axum::response::Response;
use maud::{html, Markup};
use txoutbox::admin::{FailureGroup, MessageStatus};

use super::{hidden_fields, layout, render, time};
use crate::auth::{Caller, Principal};
use crate::query::{encode, FilterFields};
use crate::redact::Scrubber;

pub(crate) async fn failures(Caller { app, who, base }: Caller) -> Response {
    let result = async {
        let client = app.client().await?;
        let groups = txoutbox::admin::failure_groups(&**client, 200).await?;
        let scrub = app.redaction.shapes();
        let (unknown, failed): (Vec<_>, Vec<_>) = groups
            .iter()
            .partition(|g| g.status == MessageStatus::Unknown);
        let rows = |groups: &[&FailureGroup]| groups.iter().map(|g| g.count).sum::<u64>();
        let b = &base.0;
        let body = html! {
            section id="unknown" data-live aria-labelledby="unknown-h" {
                h2 id="unknown-h" {
                    "Unknown outcome "
                    span class={"count" @if !unknown.is_empty() { " alarm" }} { (rows(&unknown)) " row(s)" }
                }
                @if unknown.is_empty() {
                    p { "No unknown row." }
                } @else {
                    p class="note" {
                        "At-most-once calls that may or may not have reached the downstream (the relay lost the answer). "
                        "Check the downstream first: replay only what did not happen, discard what did."
                    }
                    (table(b, &who, &scrub, &unknown))
                }
            }
            section id="groups" data-live aria-labelledby="failed-h" {
                h2 id="failed-h" {
                    "Failed "
                    span class={"count" @if !failed.is_empty() { " alarm" }} { (rows(&failed)) " row(s)" }
                }
                @if failed.is_empty() { p { "No failed message." } } @else {
                    (table(b, &who, &scrub, &failed))
                }
            }
        };
        Ok(layout(&base, &who, "Failures", "/failures", body))
    }
    .await;
    render(&base, result)
}

/// One state's groups: destination, normalised error (and an example), rows, first and last
/// seen, and the group's actions.
fn table(b: &str, who: &Principal, scrub: &Scrubber<'_>, groups: &[&FailureGroup]) -> Markup {
    html! {
        table class={"groups " (groups.first().map_or("failed", |g| g.status.as_str()))} {
            thead { tr {
                th scope="col" { "Destination" }
                th scope="col" { "Error (normalised)" }
                th scope="col" class="num" { "Rows" }
                th scope="col" { "First seen" }
                th scope="col" { "Last seen" }
                @if who.may_act() { th scope="col" { "Action" } }
            } }
            tbody {
                @for g in groups { (group(b, who, scrub, g)) }
            }
        }
    }
}

fn group(b: &str, who: &Principal, scrub: &Scrubber<'_>, g: &FailureGroup) -> Markup {
    let fields = FilterFields {
        status: Some(g.status.as_str().into()),
        destination: Some(g.destination.clone()),
        error_class: Some(g.error.clone()),
        ..FilterFields::default()
    };
    // A class holding text the dashboard hides is named by no link or form (the normalised
    // classes hold none: addresses are replaced).
    let linked = scrub.is_clean(&g.error);
    let class = scrub.text(&g.error);
    html! {
        tr {
            td { (g.destination) }
            td class="error" {
                (class)
                @if let Some(e) = &g.example {
                    @let e = scrub.text(e);
                    @if e != class { br; small { "e.g. " (e) } }
                }
            }
            td class="num" {
                @if linked { a href={(b) "/messages?" (encode(fields.to_pairs()))} { (g.count) } }
                @else { (g.count) }
            }
            td { (time(g.first_seen)) }
            td { (time(g.last_seen)) }
            @if who.may_act() && linked {
                td {
                    form method="post" action={(b) "/replay/filter"} {
                        (hidden_fields(&fields))
                        button type="submit" { "Replay this group…" }
                        " "
                        button type="submit" formaction={(b) "/discard/filter"} { "Discard this group…" }
                    }
                }
            } @else if who.may_act() {
                td {}
            }
        }
    }
}
