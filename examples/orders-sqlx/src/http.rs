//! The routes: `POST /orders` (idempotent, one sqlx transaction) and `GET /orders/{id}`.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use example_support::{check_amount, check_text};
use serde::Deserialize;
use serde_json::json;
use txoutbox::Scope;
use txoutbox_axum::{Idempotent, Problem, Started};
use uuid::Uuid;

use crate::queries;

/// The largest request body accepted (an order is about a hundred bytes); a larger one is a 413
/// problem document.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The largest amount accepted, in the currency's smallest unit (a larger one is a 422).
pub use example_support::MAX_AMOUNT;

/// What the handlers share.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    pool: sqlx::PgPool,
    orders: Scope,
    crash_after_commit: bool,
}

impl App {
    /// Handlers over `pool`; with `crash_after_commit`, the process aborts after each order's
    /// commit, before its answer is sent (for crash tests).
    pub fn new(pool: sqlx::PgPool, crash_after_commit: bool) -> anyhow::Result<Self> {
        let orders = Scope::new("orders")?;
        // The idempotency counters exist at 0 from start (a no-op without a recorder).
        txoutbox::telemetry::register_scopes([&orders]);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                orders,
                crash_after_commit,
            }),
        })
    }
}

/// The service's routes.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route("/orders/{id}", get(show_order))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

/// `POST /orders`'s body.
#[derive(Debug, Deserialize)]
struct NewOrder {
    customer_id: String,
    amount: i64,
    email: String,
}

/// An order's effects, built (and checked by their payload builders) before anything is written.
struct Effects {
    receipt: txoutbox::OutboxMessage,
    created: txoutbox::OutboxMessage,
}

fn invalid(detail: impl Into<String>) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "urn:orders-sqlx:invalid-order",
        "Invalid order",
        detail,
    )
}

/// The body as an order: not JSON is a 400 problem; JSON that is not an order (a field missing,
/// a string for the amount, a number past i64) a 422.
fn parse(body: &[u8]) -> Result<NewOrder, Problem> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => invalid(e.to_string()),
        _ => Problem::invalid_body(format!("the body is not JSON: {e}")),
    })
}

/// Every refusal is a 422 decided before the transaction opens: not stored with the key, the
/// same body is refused the same way on every retry.
fn check(order: &NewOrder, id: Uuid) -> Result<Effects, Problem> {
    check_text("customer_id", &order.customer_id, 255).map_err(invalid)?;
    check_text("email", &order.email, 254).map_err(invalid)?;
    check_amount(order.amount).map_err(invalid)?;
    let receipt = txoutbox_email::Email::new(
        "Orders <orders@orders-sqlx.example>",
        order.email.clone(),
        "Your order",
    )
    .text(format!("We received your order {id} of {}.", order.amount));
    receipt
        .validate()
        .map_err(|e| invalid(format!("email is not an address: {e}")))?;
    let created = txoutbox_webhook::Webhook::new(
        "order.created",
        json!({"order_id": id, "customer_id": order.customer_id, "amount": order.amount}),
    );
    Ok(Effects {
        receipt: receipt.into_outbox_message()?,
        created: created.into_outbox_message()?,
    })
}

async fn create_order(State(app): State<App>, request: Idempotent) -> Result<Response, Problem> {
    let order = parse(request.body())?;
    let id = Uuid::now_v7();
    let effects = check(&order, id)?;
    let mut tx = app.inner.pool.begin().await?;
    let mut claim = match request.begin(&mut tx, &app.inner.orders).await? {
        Started::New(claim) => claim,
        Started::Answered(answer) => return Ok(answer), // a replay, 409 or 422
    };
    sqlx::query(queries::INSERT_ORDER)
        .bind(id)
        .bind(&order.customer_id)
        .bind(order.amount)
        .bind(&order.email)
        .execute(&mut *tx)
        .await?;
    claim.enqueue("receipt", effects.receipt)?;
    claim.enqueue("order_created", effects.created)?;
    let answer = (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/orders/{id}"))],
        Json(json!({"order_id": id})),
    );
    let response = request.complete(tx, claim, answer).await?;
    if app.inner.crash_after_commit {
        example_support::crash("after_commit");
    }
    Ok(response)
}

async fn show_order(State(app): State<App>, Path(id): Path<String>) -> Result<Response, Problem> {
    // An id that is not a UUID names no order: a 404 as for an unknown one.
    let Ok(uuid) = Uuid::parse_str(&id) else {
        return Err(Problem::blank(
            StatusCode::NOT_FOUND,
            "no order: the id is not a UUID",
        ));
    };
    let missing = || Problem::blank(StatusCode::NOT_FOUND, format!("no order {uuid}"));
    let row: Option<(Uuid, String, i64, String, DateTime<Utc>)> = sqlx::query_as(queries::ORDER)
        .bind(uuid)
        .fetch_optional(&app.inner.pool)
        .await?;
    let Some((order_id, customer_id, amount, email, created_at)) = row else {
        return Err(missing());
    };
    Ok(Json(json!({
        "order_id": order_id,
        "customer_id": customer_id,
        "amount": amount,
        "email": email,
        "created_at": created_at,
    }))
    .into_response())
}
