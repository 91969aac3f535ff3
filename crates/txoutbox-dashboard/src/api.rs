//! The JSON API beside the pages, for scripts: the same data and the same actions, the same
//! users and roles, redacted the same way.

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use txoutbox::admin::{MessageStatus, ReplaySelection, StoredJson};
use uuid::Uuid;

use crate::auth::Caller;
use crate::pages::{pause_reason, shown_flow, shown_message, shown_response, MessageAction};
use crate::query::{page, pairs, storable, value, FilterFields};
use crate::redact::{Redaction, Shown};
use crate::{json, Failure, Shared};

#[derive(Serialize)]
struct Problem {
    error: String,
    /// With a destination nothing names: the ones that exist, closest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    known_destinations: Option<Vec<String>>,
}

fn answer<T: Serialize>(result: Result<T, Failure>) -> Response {
    match result {
        Ok(value) => json(StatusCode::OK, &value),
        Err(failure) => problem(&failure),
    }
}

/// A failure as the API answers it: its status and `{"error": "<text>"}` (with
/// `known_destinations` for a destination nothing names).
pub(crate) fn problem(failure: &Failure) -> Response {
    let known_destinations = match failure {
        Failure::Admin(txoutbox::admin::AdminError::UnknownDestination { known, .. }) => {
            Some(known.clone())
        }
        _ => None,
    };
    json(
        failure.status(),
        &Problem {
            error: failure.to_string(),
            known_destinations,
        },
    )
}

/// `GET /api/stats`: counts by destination and state, oldest pending age, the last hour's
/// failure rate and its minutes.
pub(crate) async fn stats(State(app): State<Shared>) -> Response {
    #[derive(Serialize)]
    struct Stats {
        #[serde(flatten)]
        stats: txoutbox::admin::OutboxStats,
        last_hour_by_minute: Vec<txoutbox::admin::MinuteActivity>,
    }
    answer(
        async {
            let client = app.client().await?;
            let mut stats = txoutbox::admin::stats(&**client).await?;
            stats.flow = shown_flow(&app.redaction, stats.flow);
            Ok(Stats {
                stats,
                last_hour_by_minute: txoutbox::admin::activity(&**client, 60).await?,
            })
        }
        .await,
    )
}

/// `GET /api/messages?status=failed&destination=…&limit=…&before=…`: the `/messages` filter;
/// newest first. The next page is `before=` the last row's `cursor`.
pub(crate) async fn messages(State(app): State<Shared>, RawQuery(query): RawQuery) -> Response {
    #[derive(Serialize)]
    struct Row {
        #[serde(flatten)]
        message: txoutbox::admin::MessageSummary,
        cursor: String,
    }
    answer(
        async {
            let pairs = pairs(query.unwrap_or_default().as_bytes());
            let mut filter = FilterFields::from_pairs(&pairs).filter(&app.redaction)?;
            let (cursor, limit) = page(&pairs, app.config.page_size, 1000)?;
            filter.before = cursor;
            filter.limit = Some(limit);
            let client = app.client().await?;
            let rows = txoutbox::admin::list_messages(&**client, &filter).await?;
            let scrub = app.redaction.shapes();
            Ok(rows
                .into_iter()
                .map(|mut m| {
                    m.last_error = scrub.opt(m.last_error.as_deref());
                    Row {
                        cursor: m.cursor().to_string(),
                        message: m,
                    }
                })
                .collect::<Vec<_>>())
        }
        .await,
    )
}

fn parse_id(id: &str) -> Result<Uuid, Failure> {
    Uuid::parse_str(id).map_err(|_| Failure::NotFound)
}

/// `GET /api/messages/{id}`: payload and headers (redacted, or withheld when they cannot be),
/// attempts (their text scrubbed).
pub(crate) async fn message(State(app): State<Shared>, Path(id): Path<String>) -> Response {
    answer(
        async {
            let id = parse_id(&id)?;
            let client = app.client().await?;
            Ok(shown_message(
                &app.redaction,
                txoutbox::admin::show_message(&**client, id).await?,
            ))
        }
        .await,
    )
}

/// How to replay, as the API takes it (every field optional).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ReplayBody {
    pub(crate) new_key: bool,
    pub(crate) include_delivered: bool,
    pub(crate) dry_run: bool,
    /// Refuse (409, nothing changed) when more rows than this match.
    pub(crate) max_rows: Option<u64>,
    /// Replay these ids (all or none) instead of a filter.
    pub(crate) ids: Option<Vec<Uuid>>,
    pub(crate) filter: Option<FilterBody>,
}

/// The `/messages` filter as JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct FilterBody {
    status: Option<String>,
    destination: Option<String>,
    since: Option<String>,
    until: Option<String>,
    downstream_key: Option<String>,
    ordering_key: Option<String>,
    error: Option<String>,
    error_class: Option<String>,
}

/// How to discard, as the API takes it: a reason, and ids or a filter.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct DiscardBody {
    /// Why the rows are closed without delivery (required, not blank).
    pub(crate) reason: Option<String>,
    pub(crate) dry_run: bool,
    /// Refuse (409, nothing changed) when more rows than this match.
    pub(crate) max_rows: Option<u64>,
    /// Discard these ids (all or none) instead of a filter.
    pub(crate) ids: Option<Vec<Uuid>>,
    pub(crate) filter: Option<FilterBody>,
}

/// A JSON body (blank: every field's default); one that is not valid is a 400.
fn body<T: Default + DeserializeOwned>(bytes: &Bytes) -> Result<T, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| Failure::BadRequest(format!("bad JSON body: {e}")))
}

/// The request's [`body`], for a handler that reads nothing before it: a body that is not valid
/// is answered as [`problem`] says.
pub(crate) struct JsonBody<T>(T);

impl<T: Default + DeserializeOwned> FromRequest<Shared> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(request: Request, app: &Shared) -> Result<Self, Response> {
        let bytes = Bytes::from_request(request, app)
            .await
            .map_err(IntoResponse::into_response)?;
        body(&bytes)
            .map(JsonBody)
            .map_err(|failure| problem(&failure))
    }
}

/// The rows a replay or discard body names: its ids, or its filter (none: every row).
fn selection(
    ids: &Option<Vec<Uuid>>,
    filter: &Option<FilterBody>,
    redaction: &Redaction,
) -> Result<ReplaySelection, Failure> {
    match (ids, filter) {
        (Some(_), Some(_)) => Err(Failure::BadRequest("give ids or a filter, not both".into())),
        (Some(ids), None) => Ok(ReplaySelection::Ids(ids.clone())),
        (None, filter) => {
            let f = filter.as_ref();
            let get = |pick: fn(&FilterBody) -> &Option<String>| f.and_then(|f| pick(f).clone());
            let fields = FilterFields {
                status: get(|f| &f.status),
                destination: get(|f| &f.destination),
                since: get(|f| &f.since),
                until: get(|f| &f.until),
                key: get(|f| &f.downstream_key),
                ordering_key: get(|f| &f.ordering_key),
                error: get(|f| &f.error),
                error_class: get(|f| &f.error_class),
            };
            if let Some(status) = &fields.status {
                status.parse::<MessageStatus>()?;
            }
            Ok(ReplaySelection::Filter(fields.filter(redaction)?))
        }
    }
}

/// Refuses a selection in the body of an action on the message its path names: an operator who
/// sent `ids` or a `filter` meant other rows than the one the action would touch.
fn path_names_the_message<I, F>(ids: &Option<I>, filter: &Option<F>) -> Result<(), Failure> {
    if ids.is_some() || filter.is_some() {
        return Err(Failure::BadRequest(
            "the path names the message: give no ids or filter".into(),
        ));
    }
    Ok(())
}

/// `POST /api/messages/{id}/replay` with an optional body `{"new_key": true}`, and
/// `POST /api/messages/{id}/discard` with `{"reason": "…"}` (and optionally `"dry_run": true`).
/// The body is read after the id, so that an id that names no message is a 404 whatever the
/// body.
pub(crate) async fn act_on_one<A: MessageAction>(
    Caller { app, who, .. }: Caller,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Response
where
    A::Report: Serialize,
{
    answer(
        async {
            let id = parse_id(&id)?;
            let body: A::Body = body(&bytes)?;
            let (ids, filter) = A::named(&body);
            path_names_the_message(ids, filter)?;
            let options = A::from_body(&body, &who)?;
            options.run(&app, &ReplaySelection::Ids(vec![id])).await
        }
        .await,
    )
}

/// `POST /api/replay` with `{"filter": {...}, "dry_run": true}` or `{"ids": [...]}`, and
/// `POST /api/discard` with `{"filter": {...}, "dry_run": true, "reason": "…"}` or
/// `{"ids": [...], "reason": "…"}`.
pub(crate) async fn act_on_selected<A: MessageAction>(
    Caller { app, who, .. }: Caller,
    JsonBody(body): JsonBody<A::Body>,
) -> Response
where
    A::Report: Serialize,
{
    answer(
        async {
            let (ids, filter) = A::named(&body);
            let selection = selection(ids, filter, &app.redaction)?;
            let options = A::from_body(&body, &who)?;
            options.run(&app, &selection).await
        }
        .await,
    )
}

/// `GET /api/destinations`: every destination with a flow-control row, by name: its state
/// (`paused`, `open`, `half_open`, `closed`), who paused it, when and why, its rate limit and
/// tokens, its breaker's failures, until when it is open and why.
pub(crate) async fn destinations(State(app): State<Shared>) -> Response {
    answer(
        async {
            let client = app.client().await?;
            let flows = txoutbox::admin::destination_flows(&**client).await?;
            Ok(shown_flow(&app.redaction, flows))
        }
        .await,
    )
}

/// `GET /api/relays`: every relay that recorded itself, alive ones first ([`RelayRecord`]'s
/// fields, `stale` after three missed heartbeats).
///
/// [`RelayRecord`]: txoutbox::admin::RelayRecord
pub(crate) async fn relays(State(app): State<Shared>) -> Response {
    answer(
        async {
            let client = app.client().await?;
            Ok(txoutbox::admin::relays(&**client).await?)
        }
        .await,
    )
}

/// How to pause, as the API takes it.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct PauseBody {
    /// Why no relay may call the destination (required, not blank).
    reason: Option<String>,
    /// Pause a destination nothing names yet (one about to be used).
    force: bool,
}

/// How to resume, as the API takes it (an empty body or `{}` will do).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ResumeBody {
    /// Skip the check that something names the destination.
    force: bool,
}

/// `POST /api/destinations/{destination}/pause` with `{"reason": "…"}`: the destination's flow
/// state afterwards. Pausing a paused destination updates the reason. A destination nothing
/// names (no row, flow-control state or configured sink) is a 400 with `known_destinations`,
/// closest first, unless the body says `"force": true`.
pub(crate) async fn pause_destination(
    Caller { app, who, .. }: Caller,
    Path(destination): Path<String>,
    JsonBody(body): JsonBody<PauseBody>,
) -> Response {
    answer(
        async {
            let reason = pause_reason(body.reason.as_deref())?;
            app.pause(&destination, reason, &who, body.force).await
        }
        .await,
    )
}

/// `POST /api/destinations/{destination}/resume` (optionally `{"force": true}`): the
/// destination's flow state afterwards; 400 when it is not paused, or when nothing names it.
pub(crate) async fn resume_destination(
    Caller { app, who, .. }: Caller,
    Path(destination): Path<String>,
    JsonBody(body): JsonBody<ResumeBody>,
) -> Response {
    answer(app.resume(&destination, &who, body.force).await)
}

/// `GET /api/keys?scope=…&key=…`: the key row (its stored response redacted, or its body
/// withheld when it cannot be) and the messages its request enqueued; without such a key, the
/// inbox record of consumer `scope` and message id `key` (`{"inbox": …, "messages": …}`).
pub(crate) async fn key(State(app): State<Shared>, RawQuery(query): RawQuery) -> Response {
    answer(
        async {
            let pairs = pairs(query.unwrap_or_default().as_bytes());
            let get = |name: &str| {
                value(&pairs, name)
                    .map(str::to_owned)
                    .ok_or_else(|| Failure::BadRequest(format!("{name}= is required")))
            };
            let (scope, key) = (get("scope")?, get("key")?);
            storable("scope", &scope)?;
            storable("key", &key)?;
            let client = app.client().await?;
            let Some(found) =
                txoutbox::admin::lookup_key(&**client, &scope, &key, &app.config.effects).await?
            else {
                // No key of that scope: an inbox record of that consumer, if there is one.
                let inbox =
                    txoutbox::admin::lookup_inbox(&**client, &scope, &key, &app.config.effects)
                        .await?
                        .ok_or(Failure::NotFound)?;
                let scrub = app.redaction.shapes();
                let mut record = inbox.record;
                record.error = scrub.opt(record.error.as_deref());
                let mut messages = inbox.messages;
                for m in &mut messages {
                    m.last_error = scrub.opt(m.last_error.as_deref());
                }
                return Ok(serde_json::json!({ "inbox": record, "messages": messages }));
            };
            let response = shown_response(&app.redaction, &found.record);
            let mut record = found.record;
            record.response_headers = match response.undecodable_headers {
                None => StoredJson::Decoded(response.headers),
                Some((error, shown)) => StoredJson::Undecodable {
                    text: shown.to_text(),
                    error,
                },
            };
            record.response_body = None;
            let scrub = app.redaction.shapes();
            let mut messages = found.messages;
            for m in &mut messages {
                m.last_error = scrub.opt(m.last_error.as_deref());
            }
            let mut value =
                serde_json::to_value(&record).map_err(|e| Failure::BadRequest(e.to_string()))?;
            // Text, as before: the JSON body pretty-printed, the text, or the placeholder.
            value["response_body"] = response.body.as_ref().map(Shown::to_text).into();
            value["messages"] =
                serde_json::to_value(&messages).map_err(|e| Failure::BadRequest(e.to_string()))?;
            Ok(value)
        }
        .await,
    )
}
