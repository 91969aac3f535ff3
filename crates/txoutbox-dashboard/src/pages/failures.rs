//! The failures: failed messages grouped by destination and normalised error, each group a
//! link to its rows and, for an operator, a replay or discard of the group. The error text is
//! scrubbed by shape (the groups do not read payloads).

use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use maud::html;

use super::{hidden_fields, layout, render, time};
use crate::auth::{Base, Principal};
use crate::query::{encode, FilterFields};
use crate::Shared;

pub(crate) async fn failures(
    State(app): State<Shared>,
    Extension(who): Extension<Principal>,
    Extension(base): Extension<Base>,
) -> Response {
    let result = async {
        let client = app.client().await?;
        let groups = txoutbox::admin::failure_groups(&**client, 200).await?;
        let scrub = app.redaction.shapes();
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
                                // A class holding text the dashboard hides is named by no link
                                // or form (the normalised classes hold none: addresses and
                                // digits are replaced).
                                @let linked = scrub.is_clean(&g.error);
                                @let class = scrub.text(&g.error);
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
                    }
                }
            }
        };
        Ok(layout(&base, &who, "Failures", "/failures", body))
    }
    .await;
    render(&base, result)
}
