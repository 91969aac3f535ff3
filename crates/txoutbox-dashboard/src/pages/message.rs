//! One message: its fields and trace link, its actions, the payload as a tree, its headers
//! and its attempt log, with the configured fields redacted.

use std::collections::BTreeMap;

use axum::extract::Path;
use axum::response::Response;
use maud::{html, Markup};
use serde::Serialize;
use serde_json::Value;
use txoutbox::admin::{AttemptRecord, MessageDetail, MessageStatus, MessageSummary, StoredJson};
use uuid::Uuid;

use super::actions::{DISCARD_NOTE, NEW_KEY_WARNING};
use super::{columns, layout, render, status_badge, time};
use crate::auth::Caller;
use crate::redact::{Redaction, Shown, REDACTED};
use crate::Failure;

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

/// A message as the browser may see it: its payload and headers redacted (or withheld), its
/// free text (last error, attempt errors, receipts) scrubbed of what they hid. The API answers
/// it as JSON, in the shape of [`MessageDetail`].
#[derive(Debug, Serialize)]
pub(crate) struct ShownMessage {
    #[serde(flatten)]
    pub message: MessageSummary,
    pub payload: Shown,
    pub headers: Shown,
    /// Why the payload or headers cannot be decoded (shown as stored, or withheld when
    /// redacting), one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub undecodable: Vec<String>,
    pub receipt: Option<String>,
    pub history: Vec<AttemptRecord>,
}

/// `detail` as the browser may see it.
pub(crate) fn shown_message(redaction: &Redaction, detail: MessageDetail) -> ShownMessage {
    let mut undecodable = Vec::new();
    let payload = match detail.payload {
        StoredJson::Decoded(payload) => redaction.json(payload),
        StoredJson::Undecodable { text, error } => {
            undecodable.push(("payload", error));
            redaction.undecodable(text.as_bytes())
        }
    };
    let headers = match detail.headers {
        StoredJson::Decoded(headers) => redaction.json(headers_document(headers)),
        StoredJson::Undecodable { text, error } => {
            undecodable.push(("headers", error));
            redaction.undecodable(text.as_bytes())
        }
    };
    let scrub = redaction.scrubber(&[&payload.hidden, &headers.hidden]);
    // serde_json's reason can quote a value ("invalid type: string \"…\""): scrubbed as text.
    let undecodable = undecodable
        .into_iter()
        .map(|(what, why)| format!("the {what} cannot be decoded: {}", scrub.text(&why)))
        .collect();
    let mut message = detail.message;
    message.last_error = scrub.opt(message.last_error.as_deref());
    let history = detail
        .history
        .into_iter()
        .map(|mut a| {
            a.error = scrub.opt(a.error.as_deref());
            a.receipt = scrub.opt(a.receipt.as_deref());
            a
        })
        .collect();
    ShownMessage {
        message,
        payload: payload.shown,
        headers: headers.shown,
        undecodable,
        receipt: scrub.opt(detail.receipt.as_deref()),
        history,
    }
}

/// A message's headers as the JSON object they are stored as.
fn headers_document(headers: BTreeMap<String, String>) -> Value {
    Value::Object(
        headers
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    )
}

/// A header's value: its text, marked when redacted.
fn header_value(value: &Value) -> Markup {
    match value {
        Value::String(s) if s == REDACTED => html! { span class="redacted" { (s) } },
        Value::String(s) => html! { code { (s) } },
        other => html! { code { (other.to_string()) } },
    }
}

/// A shown document: its tree, its text, or why it is withheld.
fn document(shown: &Shown) -> Markup {
    match shown {
        Shown::Json(v) => html! { div class="tree" { (json_tree(v)) } },
        Shown::Text(t) => html! { pre { (t) } },
        Shown::Withheld(why) => html! { p class="withheld" { (why) } },
    }
}

/// A message's headers: a table of names and values, or the document when it is not one.
fn headers_table(headers: &Shown) -> Markup {
    match headers {
        Shown::Json(Value::Object(map)) if map.is_empty() => html! { p { "None." } },
        Shown::Json(Value::Object(map)) => html! {
            table { tbody {
                @for (k, v) in map {
                    tr { th scope="row" { (k) } td { (header_value(v)) } }
                }
            } }
        },
        other => document(other),
    }
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let _version = parts.next()?;
    let id = parts.next()?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

pub(crate) async fn message(Caller { app, who, base }: Caller, Path(id): Path<String>) -> Response {
    let result = async {
        let id = Uuid::parse_str(&id).map_err(|_| Failure::NotFound)?;
        let client = app.client().await?;
        let detail = shown_message(
            &app.redaction,
            txoutbox::admin::show_message(&**client, id).await?,
        );
        let m = &detail.message;
        let body = html! {
            (summary(&detail, app.config.trace_url.as_deref()))
            @if who.may_act() && matches!(m.status, MessageStatus::Failed | MessageStatus::Unknown | MessageStatus::Delivered) {
                (actions(&base.0, m))
            }
            section aria-labelledby="payload-h" {
                h2 id="payload-h" { "Payload" }
                @for why in &detail.undecodable {
                    p class="undecodable" { (why) }
                }
                (document(&detail.payload))
            }
            section aria-labelledby="headers-h" {
                h2 id="headers-h" { "Headers" }
                (headers_table(&detail.headers))
            }
            (attempts(&detail.history))
        };
        Ok(layout(&base, &who, &format!("Message {id}"), "/messages", body))
    }
    .await;
    render(&base, result)
}

/// The message's fields, its receipt and its trace (a link when the dashboard knows where
/// traces are shown).
fn summary(detail: &ShownMessage, trace_url: Option<&str>) -> Markup {
    let m = &detail.message;
    let trace = match &detail.headers {
        Shown::Json(Value::Object(map)) => map
            .get("traceparent")
            .and_then(Value::as_str)
            .and_then(trace_id)
            .map(str::to_owned),
        _ => None,
    };
    html! {
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
                @if m.waits_for_row_ahead {
                    dt { "Next attempt" } dd { "waits for the row ahead" }
                } @else if let Some(at) = m.next_attempt_at {
                    dt { "Next attempt" } dd { (time(at)) }
                }
                @if let Some(at) = m.delivered_at { dt { "Delivered" } dd { (time(at)) } }
                @if let Some(e) = &m.last_error { dt { "Last error" } dd class="error" { (e) } }
                @if let Some(owner) = &m.lease_owner { dt { "Lease" } dd { (owner) @if let Some(at) = m.lease_expires_at { " until " (time(at)) } } }
                @if let Some(r) = &detail.receipt { dt { "Receipt" } dd { code { (r) } } }
                @if let Some(t) = &trace {
                    dt { "Trace" }
                    dd {
                        @match trace_url {
                            Some(url) => a href=(url.replace("{trace_id}", t)) { code { (t) } },
                            None => code { (t) },
                        }
                    }
                }
            }
        }
    }
}

/// An operator's actions on a failed, unknown or delivered message: replay (with the same key
/// or a new one), discard.
fn actions(b: &str, m: &MessageSummary) -> Markup {
    html! {
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
}

/// The attempt log, oldest first.
fn attempts(history: &[AttemptRecord]) -> Markup {
    html! {
        section id="attempts" data-live aria-labelledby="attempts-h" {
            h2 id="attempts-h" { "Attempts" }
            @if history.is_empty() { p { "No attempt yet." } } @else {
                table class="attempts" {
                    thead { tr {
                        (columns(&["#", "Relay", "Started", "Ended", "Outcome", "Error or note", "Receipt", "Key"], &["#"]))
                    } }
                    tbody {
                        @for a in history {
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
    }
}
