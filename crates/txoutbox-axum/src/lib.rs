//! txoutbox for axum: read the `Idempotency-Key`, run the handler in the caller's Postgres
//! transaction, store its answer with the key, and replay that answer to every retry.
//!
//! ```no_run
//! use axum::{extract::State, http::StatusCode, response::{IntoResponse, Response}, Json};
//! use txoutbox_axum::{Idempotent, Problem, Started};
//!
//! #[derive(Clone)]
//! struct App { pool: deadpool_postgres::Pool, scope: txoutbox::Scope }
//!
//! async fn charge(State(app): State<App>, request: Idempotent) -> Result<Response, Problem> {
//!     let mut conn = app.pool.get().await?;            // Postgres down: 503 + Retry-After
//!     let tx = conn.transaction().await?;
//!     let mut claim = match request.begin(&tx, &app.scope).await? {
//!         Started::New(claim) => claim,
//!         Started::Answered(stored) => return Ok(stored), // replay, 422 or 409
//!     };
//!     let body: serde_json::Value = request.json()?;
//!     tx.execute("INSERT INTO charges (amount) VALUES ($1)", &[&body["amount"].as_i64()]).await?;
//!     claim.enqueue("receipt", txoutbox::OutboxMessage::new("email", &body)?)?;
//!     // Stores status, headers and body with the key and commits; a 5xx rolls back instead.
//!     Ok(request.complete(tx, claim, (StatusCode::CREATED, Json(body))).await?)
//! }
//! ```
//!
//! On sqlx (feature `sqlx`), the handler is the same with `let mut tx = pool.begin().await?;`
//! and `request.begin(&mut tx, &scope)`; `complete(tx, …)` and `Prepared::commit(tx)` take the
//! sqlx transaction by value, and a `sqlx::Error` converts into a [`Problem`] (503 when
//! Postgres cannot be reached). What each driver costs: the repository's `docs/drivers.md`.
//!
//! The rules, as the core states them ([`txoutbox::begin`]):
//! - the key is an RFC 8941 sf-string, `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`
//!   (draft-ietf-httpapi-idempotency-key-header); the bare spelling is the same key;
//! - a method other than GET/HEAD without an `Idempotency-Key` is answered 400, as are a
//!   malformed key, two keys, and a key shorter than the scope's minimum (16 characters by
//!   default); GET and HEAD need none;
//! - a retry with the same key and the same request (method, path, canonical JSON body) gets the
//!   stored answer, marked `Idempotent-Replayed: true`; another request under a used key gets 422;
//!   a key held by a request still running gets 409 with `Retry-After`;
//! - a handler's 1xx–4xx answers are stored (business outcomes such as "out of stock" included);
//!   a 5xx or an error rolls everything back, so a retry runs the request again;
//! - Postgres unreachable is 503 with `Retry-After`: nothing was decided, nothing is assumed
//!   (the detail says when to retry; why is for the service's log, never for the client).
//!
//! Every error is an RFC 9457 problem document ([`Problem`], `application/problem+json`): by
//! default `about:blank`, titled with its status phrase, the `detail` saying what happened; a
//! service that documents the problem types gives each its own `type` and title with
//! [`set_problem_base`].
//!
//! The receiving half: [`SignedWebhook`] verifies a Standard Webhooks request (signature under
//! one of the endpoint's secrets, timestamp within 5 minutes) before the handler sees it, and
//! [`SignedWebhook::receive`] records its `webhook-id` in the inbox ([`txoutbox::inbox`]) in
//! the handler's transaction: a redelivery is answered 2xx without applying it again.
//!
//! ```no_run
//! use axum::{extract::{FromRef, State}, http::StatusCode, response::{IntoResponse, Response}};
//! use txoutbox_axum::{Problem, Received, SignedWebhook, WebhookReceiver};
//!
//! #[derive(Clone)]
//! struct App { pool: deadpool_postgres::Pool, webhooks: WebhookReceiver }
//! impl FromRef<App> for WebhookReceiver {
//!     fn from_ref(app: &App) -> Self { app.webhooks.clone() }
//! }
//!
//! async fn webhook(State(app): State<App>, hook: SignedWebhook) -> Result<Response, Problem> {
//!     let mut conn = app.pool.get().await?;
//!     let tx = conn.transaction().await?;
//!     let claim = match hook.receive(&tx).await? {
//!         Received::New(claim) => claim,
//!         Received::Duplicate(answer) => return Ok(answer), // 200: applied before
//!     };
//!     let event: serde_json::Value = hook.json()?;
//!     tx.execute("INSERT INTO shipments (charge_id) VALUES ($1)", &[&event["data"]["charge_id"].as_str()]).await?;
//!     claim.complete(&tx).await?;
//!     tx.commit().await?;
//!     Ok(StatusCode::NO_CONTENT.into_response())
//! }
//! ```
//!
//! Layout: `extract` holds the [`Idempotent`] extractor and the begin/complete steps;
//! `webhook` the [`SignedWebhook`] extractor, its [`WebhookReceiver`] configuration and its
//! refusals ([`WebhookRejection`]);
//! `rejection` its refusals ([`IdempotencyRejection`]); `problem` holds [`Problem`], the error
//! answer; [`health`] the `/healthz` and `/readyz` routes of a process that runs a relay (and,
//! with the feature `prometheus`, `MetricsServer`: those two and `/metrics` on an address of
//! their own); `prometheus` (feature `prometheus`) a recorder sized for txoutbox's histograms and
//! the `GET /metrics` route.

/// A rejection answers as its `problem()`, and a handler's `?` turns it into that [`Problem`].
macro_rules! answers_as_problem {
    ($($rejection:ty),+ $(,)?) => {$(
        impl axum::response::IntoResponse for $rejection {
            fn into_response(self) -> axum::response::Response {
                axum::response::IntoResponse::into_response(self.problem())
            }
        }

        impl From<$rejection> for crate::Problem {
            fn from(rejection: $rejection) -> Self {
                rejection.problem()
            }
        }
    )+};
}

mod extract;
pub mod health;
mod problem;
#[cfg(feature = "prometheus")]
pub mod prometheus;
mod rejection;
mod webhook;

pub use extract::{Idempotent, Prepared, Started, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use problem::{
    problem_type, set_problem_base, status_title, Problem, PROBLEM_JSON, UNAVAILABLE_RETRY_AFTER,
};
pub use rejection::IdempotencyRejection;
/// The W3C trace-context request header; its value is attached to the request's effects.
pub use txoutbox::telemetry::TRACEPARENT;
pub use webhook::{Received, SignedWebhook, WebhookReceiver, WebhookRejection};
