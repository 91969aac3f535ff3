//! The HTML pages and the forms' actions. Everything is rendered on the server and readable
//! without script; `live.js` only refreshes the parts marked `data-live`.
//!
//! This module holds the frame every page shares (layout, links, error pages, the small
//! renderers of times, ages and states) and the static assets; each page has its own file, and
//! `actions` holds the operator's forms and the handlers they post to.

mod actions;
mod failures;
mod keys;
mod message;
mod messages;
mod overview;
mod relays;

pub(crate) use actions::{
    act_on_one, act_on_selected, discard_filter, pause_destination, pause_reason, replay_filter,
    resume_destination, MessageAction,
};
pub(crate) use failures::failures;
pub(crate) use keys::{keys, shown_response};
pub(crate) use message::{message, shown_message};
pub(crate) use messages::messages;
pub(crate) use overview::{overview, shown_flow};
pub(crate) use relays::relays;

use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup, DOCTYPE};
use txoutbox::admin::MessageStatus;

use crate::auth::{Base, Principal};
use crate::query::FilterFields;
use crate::Failure;

const CSS: &str = include_str!("../../assets/dashboard.css");
const SCRIPT: &str = include_str!("../../assets/live.js");

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
        ("/relays", "Relays"),
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

pub(crate) fn error_page(base: &Base, failure: &Failure) -> Response {
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

/// A table's header cells, `columns` by name; those also in `numeric` are right-aligned like
/// their numbers.
fn columns(names: &[&str], numeric: &[&str]) -> Markup {
    html! {
        @for name in names { th scope="col" class=[numeric.contains(name).then_some("num")] { (name) } }
    }
}

/// A time as on-call reads it: how long ago (or how far ahead) by this server's clock, with
/// the absolute time beside it; a line may break between the two, never inside either.
fn time(at: DateTime<Utc>) -> Markup {
    let secs = (Utc::now() - at).num_milliseconds() as f64 / 1000.0;
    ago(at, secs)
}

/// A time `secs` seconds ago (negative: ahead), by whichever clock measured it (the
/// database's, for the ages it computes), with the absolute time beside it (see [`time`]).
fn ago(at: DateTime<Utc>, secs: f64) -> Markup {
    let text = at.to_rfc3339_opts(SecondsFormat::Secs, true);
    let whole = Duration::from_secs(secs.abs().min(1e12) as u64);
    html! {
        span class="when" {
            time datetime=(text) title=(text) {
                @if secs >= 0.0 { (age(whole)) " ago" } @else { "in " (age(whole)) }
            }
            " " small class="abs" { (text) }
        }
    }
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

fn hidden_fields(fields: &FilterFields) -> Markup {
    html! {
        @for (name, value) in fields.to_pairs() {
            input type="hidden" name=(name) value=(value);
        }
    }
}
