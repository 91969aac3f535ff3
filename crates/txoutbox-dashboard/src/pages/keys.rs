//! The key lookup: an idempotency key's record, its stored response (redacted) and the
//! messages its request enqueued.

use axum::extract::RawQuery;
use axum::response::Response;
use maud::html;
use txoutbox::admin::{IdempotencyRecord, StoredJson};

use super::messages::message_rows;
use super::{layout, render, time};
use crate::auth::{Base, Caller};
use crate::query::{pairs, storable, value};
use crate::redact::{Redaction, Shown, REDACTED};

/// A stored response as the browser may see it: its headers with the redacted ones replaced,
/// its body redacted as a JSON document (withheld when it is not one and fields are redacted).
pub(crate) struct ShownResponse {
    pub headers: Vec<(String, String)>,
    /// Headers that cannot be decoded: why, and their stored text as a document (withheld
    /// when fields are redacted and it cannot be parsed).
    pub undecodable_headers: Option<(String, Shown)>,
    pub body: Option<Shown>,
}

/// The stored response of `record`, as the browser may see it.
pub(crate) fn shown_response(redaction: &Redaction, record: &IdempotencyRecord) -> ShownResponse {
    let (headers, undecodable_headers) = match &record.response_headers {
        StoredJson::Decoded(headers) => (
            headers
                .iter()
                .map(|(name, value)| (name.clone(), redaction.header(name, value).to_owned()))
                .collect(),
            None,
        ),
        StoredJson::Undecodable { text, error } => {
            let shown = redaction.undecodable(text.as_bytes());
            // serde_json's reason can quote a value: scrubbed as the document's own text.
            let why = redaction.scrubber(&[&shown.hidden]).text(error);
            (Vec::new(), Some((why, shown.shown)))
        }
    };
    ShownResponse {
        headers,
        undecodable_headers,
        body: record
            .response_body
            .as_deref()
            .map(|body| redaction.document(body).shown),
    }
}

pub(crate) async fn keys(Caller { app, who, base }: Caller, RawQuery(query): RawQuery) -> Response {
    let result = async {
        let pairs = pairs(query.unwrap_or_default().as_bytes());
        let get = |name: &str| value(&pairs, name).unwrap_or_default().trim().to_owned();
        let (scope, key) = (get("scope"), get("key"));
        let b = &base.0;
        storable("scope", &scope)?;
        storable("key", &key)?;
        let (found, inbox) = if scope.is_empty() || key.is_empty() {
            (None, None)
        } else {
            let client = app.client().await?;
            let effects = &app.config.effects;
            (
                Some(txoutbox::admin::lookup_key(&**client, &scope, &key, effects).await?),
                txoutbox::admin::lookup_inbox(&**client, &scope, &key, effects).await?,
            )
        };
        let body = html! {
            form class="filters" method="get" action={(b) "/keys"} role="search" aria-label="Look up a key" {
                label { "Scope or consumer " input name="scope" required value=(scope); }
                label { "Idempotency-Key or message id " input name="key" required value=(key); }
                button type="submit" { "Look up" }
            }
            @if let Some(found) = &inbox { (inbox_section(&base, &app, found)) }
            @match &found {
                None => {}
                Some(None) if inbox.is_some() => {}
                Some(None) => p role="status" { "No key " code { (key) } " in scope " code { (scope) } " (never used, or pruned after its window), and no inbox record of this message id for a consumer of that name." },
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
                        @let response = shown_response(&app.redaction, r);
                        @if !response.headers.is_empty() {
                            h3 { "Response headers" }
                            table { tbody { @for (k, v) in &response.headers {
                                tr { th scope="row" { (k) } td { @if v == REDACTED { span class="redacted" { (v) } } @else { code { (v) } } } }
                            } } }
                        }
                        @if let Some((why, shown)) = &response.undecodable_headers {
                            h3 { "Response headers" }
                            p class="undecodable" { "the response headers cannot be decoded: " (why) }
                            @match shown {
                                Shown::Withheld(why) => p class="withheld" { (why) },
                                shown => pre { (shown.to_text()) },
                            }
                        }
                        @if let Some(body) = &response.body {
                            details open {
                                summary { "Response body" }
                                @match body {
                                    Shown::Withheld(why) => p class="withheld" { (why) },
                                    shown => pre { (shown.to_text()) },
                                }
                            }
                        }
                    }
                    section id="effects" data-live aria-labelledby="effects-h" {
                        h2 id="effects-h" { "Messages this request enqueued" }
                        @if found.messages.is_empty() { p { "None." } } @else { (message_rows(&base, &found.messages, false, &app.redaction.shapes())) }
                    }
                }
            }
        };
        Ok(layout(&base, &who, "Idempotency keys", "/keys", body))
    }
    .await;
    render(&base, result)
}

/// An inbox record (a received message of a consumer) and what its handler enqueued.
fn inbox_section(
    base: &Base,
    app: &crate::Shared,
    found: &txoutbox::admin::InboxLookup,
) -> maud::Markup {
    let r = &found.record;
    html! {
        section aria-labelledby="inbox-h" {
            h2 id="inbox-h" { "Inbox record" }
            dl class="fields" {
                dt { "Consumer" } dd { code { (r.consumer) } }
                dt { "Message id" } dd { code { (r.message_id) } }
                dt { "Outcome" } dd { (r.outcome) @if r.expired { " (window passed: the next delivery of this message is new)" } }
                @if let Some(error) = &r.error { dt { "Error" } dd { code { (app.redaction.shapes().text(error)) } } }
                dt { "First received" } dd { (time(r.received_at)) }
                dt { "Expires" } dd { (time(r.expires_at)) }
            }
            h3 { "Messages its handler enqueued" }
            @if found.messages.is_empty() { p { "None." } } @else { (message_rows(base, &found.messages, false, &app.redaction.shapes())) }
        }
    }
}
