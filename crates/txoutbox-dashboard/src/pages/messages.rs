//! The message list: the filter form, one page of rows (selectable by an operator) and the
//! replay and discard of what is selected or of all the filter matches.

use axum::extract::RawQuery;
use axum::response::Response;
use maud::{html, Markup};
use txoutbox::admin::{MessageStatus, MessageSummary};

use super::actions::{DISCARD_NOTE, NEW_KEY_WARNING};
use super::{columns, hidden_fields, layout, render, status_badge, time};
use crate::auth::{Base, Caller};
use crate::query::{encode, page, pairs, FilterFields};
use crate::redact::{Redaction, Scrubber};

fn filter_form(base: &Base, fields: &FilterFields, redaction: &Redaction) -> Markup {
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
            @if redaction.is_on() {
                span class="note" { "Error-text search is off: fields are redacted, and a search would confirm a hidden value." }
            } @else {
                label { "Error text " input name="error" value=(v(&fields.error)); }
            }
            @if let Some(class) = &fields.error_class {
                input type="hidden" name="error_class" value=(class);
            }
            button type="submit" { "Filter" }
            a href={(b) "/messages"} { "Clear" }
        }
    }
}

/// A table of messages; their errors scrubbed by `scrub`.
pub(super) fn message_rows(
    base: &Base,
    rows: &[MessageSummary],
    selectable: bool,
    scrub: &Scrubber<'_>,
) -> Markup {
    let b = &base.0;
    html! {
        table class="messages" {
            thead { tr {
                @if selectable { th scope="col" { span class="sr" { "Select" } } }
                (columns(&["Id", "Destination", "State", "Attempts", "Enqueued", "Last error", "Downstream key"], &["Attempts"]))
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
                        td { a href={(b) "/messages/" (m.id)} { code class="id" { (m.id) } } }
                        td { (m.destination) }
                        td { (status_badge(m.status)) }
                        td class="num" { (m.attempts) }
                        td { (time(m.created_at)) }
                        td class="error" { @if let Some(e) = &m.last_error { (scrub.text(e)) } }
                        td { code { (m.downstream_key) } }
                    }
                }
            }
        }
    }
}

pub(crate) async fn messages(
    Caller { app, who, base }: Caller,
    RawQuery(query): RawQuery,
) -> Response {
    let result = async {
        let pairs = pairs(query.unwrap_or_default().as_bytes());
        let fields = FilterFields::from_pairs(&pairs);
        let (cursor, limit) = page(&pairs, app.config.page_size, 500)?;
        let mut filter = fields.filter(&app.redaction)?;
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
        let scrub = app.redaction.shapes();
        // What a replay or a discard by this filter takes (failed rows unless it names unknown).
        let actionable = filter.status.is_none()
            || matches!(
                filter.status,
                Some(MessageStatus::Failed | MessageStatus::Unknown)
            );
        let body = html! {
            (filter_form(&base, &fields, &app.redaction))
            // Refreshed live (paused while a row is ticked): new rows appear on the first page.
            section id="results" data-live aria-label="Messages" {
                @if rows.is_empty() {
                    p { "No message matches." }
                } @else if who.may_act() {
                    form method="post" action={(b) "/replay"} {
                        (message_rows(&base, &rows, true, &scrub))
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
                    (message_rows(&base, &rows, false, &scrub))
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
