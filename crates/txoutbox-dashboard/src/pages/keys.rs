//! The key lookup: an idempotency key's record, its stored response (redacted) and the
//! messages its request enqueued.

use axum::extract::{RawQuery, State};
use axum::response::Response;
use axum::Extension;
use maud::html;
use serde_json::Value;

use super::messages::message_rows;
use super::{layout, render, time};
use crate::auth::{Base, Principal};
use crate::query::{pairs, storable};
use crate::redact::{is_redacted, redact, REDACTED};
use crate::Shared;

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
