//! The routes: `POST /charge`, `GET /charges/{id}`, `POST /inventory/{item_id}/reservations`,
//! and the checkout page at `/`.

use std::str::FromStr;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use example_support::{check_amount, check_text};
use serde::Deserialize;
use serde_json::json;
use txoutbox::{relay::RelayWaker, Scope};
use txoutbox_axum::{Idempotent, Problem, Started};
use uuid::Uuid;

use crate::queries;

/// Where `CRASH_AT` aborts the process inside `POST /charge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// After the `charges` insert, before the outbox rows and the response are written.
    AfterBusinessWrite,
    /// After everything is written, before `COMMIT`.
    BeforeCommit,
    /// After `COMMIT`, before the response is sent.
    AfterCommit,
}

impl CrashPoint {
    /// Every point, for the crash matrix.
    pub const ALL: [CrashPoint; 3] = [
        CrashPoint::AfterBusinessWrite,
        CrashPoint::BeforeCommit,
        CrashPoint::AfterCommit,
    ];

    /// The `CRASH_AT` value.
    pub fn as_str(self) -> &'static str {
        match self {
            CrashPoint::AfterBusinessWrite => "after_business_write",
            CrashPoint::BeforeCommit => "before_commit",
            CrashPoint::AfterCommit => "after_commit",
        }
    }
}

impl FromStr for CrashPoint {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        CrashPoint::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "CRASH_AT={s}: expected after_business_write, before_commit or after_commit"
                )
            })
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    pool: deadpool_postgres::Pool,
    charges: Scope,
    reservations: Scope,
    waker: RelayWaker,
    crash_at: Option<CrashPoint>,
}

impl App {
    /// Handlers over `pool`, aborting at `crash_at` if set. Must run inside a tokio runtime.
    pub fn new(
        pool: deadpool_postgres::Pool,
        crash_at: Option<CrashPoint>,
    ) -> anyhow::Result<Self> {
        let charges = Scope::new("charges")?;
        let reservations = Scope::new("reservations")?;
        // The idempotency counters exist at 0 from start (a no-op without a recorder).
        txoutbox::telemetry::register_scopes([&charges, &reservations]);
        Ok(Self {
            inner: Arc::new(Inner {
                waker: RelayWaker::spawn(pool.clone()),
                pool,
                charges,
                reservations,
                crash_at,
            }),
        })
    }

    fn crash_point(&self, point: CrashPoint) {
        example_support::crash_at(self.inner.crash_at, point, CrashPoint::as_str);
    }
}

/// The largest request body accepted (a charge is a few hundred bytes); a larger one is a 413
/// problem document.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The largest amount accepted, in the currency's smallest unit (a larger one is a 400).
pub use example_support::MAX_AMOUNT;

/// The service's routes.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/charge", post(create_charge))
        .route("/charges/{id}", get(show_charge))
        .route("/inventory/{item_id}/reservations", post(reserve))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

#[derive(Debug, Deserialize)]
struct ChargeRequest {
    customer_id: String,
    amount: i64,
    currency: String,
    email: String,
}

fn invalid(detail: impl Into<String>) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "urn:charge-service:invalid-charge",
        "Invalid charge",
        detail,
    )
}

/// Every refusal of a charge is a 400 problem document, decided before anything is written:
/// a client error is never a 5xx that a client would retry.
fn check_charge(charge: &ChargeRequest) -> Result<(), Problem> {
    check_text("customer_id", &charge.customer_id, 255).map_err(invalid)?;
    check_text("email", &charge.email, 254).map_err(invalid)?;
    check_text("currency", &charge.currency, 3).map_err(invalid)?;
    check_amount(charge.amount).map_err(invalid)?;
    if charge.currency.len() != 3 || !charge.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(invalid(
            "currency must be a three-letter ISO code such as \"eur\"",
        ));
    }
    Ok(())
}

async fn create_charge(State(app): State<App>, request: Idempotent) -> Result<Response, Problem> {
    let charge: ChargeRequest = request.json()?;
    check_charge(&charge)?;
    let currency = charge.currency.to_ascii_lowercase();
    let mut conn = app.inner.pool.get().await?;
    let tx = conn.transaction().await?;
    let mut claim = match request.begin(&tx, &app.inner.charges).await? {
        Started::New(claim) => claim,
        Started::Answered(answer) => return Ok(answer),
    };
    let charge_id = Uuid::now_v7();
    // A new claim of the key (a request after the key's window) gets a new key: a new charge.
    let payment_key = claim.downstream_key("payment_intent");
    let intent = txoutbox_stripe::NewPaymentIntent::new(charge.amount, currency.clone())
        .with_payment_method("pm_card_visa")
        .with_metadata("charge_id", charge_id.to_string())
        .with_metadata("customer_id", charge.customer_id.clone())
        .into_outbox_message()
        .map_err(|e| invalid(e.to_string()))?;
    // The hook finds the charge by this id, which a replay with a new key leaves alone.
    let payment_message_id = intent.id();
    tx.execute(
        queries::INSERT_CHARGE,
        &[
            &charge_id,
            &charge.customer_id,
            &charge.amount,
            &currency,
            &charge.email,
            &payment_key,
            &payment_message_id,
        ],
    )
    .await?;
    app.crash_point(CrashPoint::AfterBusinessWrite);
    claim.enqueue("payment_intent", intent)?;
    let receipt = txoutbox_email::Email::new(
        "Charge service <billing@charge-service.example>",
        charge.email.clone(),
        "Your receipt",
    )
    .text(format!(
        "We are charging {} {} (charge {charge_id}).",
        charge.amount,
        currency.to_uppercase()
    ))
    .into_outbox_message()
    .map_err(|e| invalid(e.to_string()))?;
    claim.enqueue("receipt", receipt)?;
    let answer = (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/charges/{charge_id}"))],
        Json(json!({
            "charge_id": charge_id,
            "status": "pending",
            "customer_id": charge.customer_id,
            "amount": charge.amount,
            "currency": currency,
        })),
    );
    let prepared = request.prepare(&tx, claim, answer).await?;
    app.crash_point(CrashPoint::BeforeCommit);
    let response = prepared.commit(tx).await?;
    app.crash_point(CrashPoint::AfterCommit);
    app.inner.waker.wake();
    Ok(response)
}

async fn show_charge(State(app): State<App>, Path(id): Path<Uuid>) -> Result<Response, Problem> {
    let conn = app.inner.pool.get().await?;
    let Some(row) = conn.query_opt(queries::CHARGE, &[&id]).await? else {
        return Err(Problem::blank(
            StatusCode::NOT_FOUND,
            format!("no charge {id}"),
        ));
    };
    let id: Uuid = row.get(0);
    Ok(Json(json!({
        "charge_id": id,
        "customer_id": row.get::<_, String>(1),
        "amount": row.get::<_, i64>(2),
        "currency": row.get::<_, String>(3),
        "email": row.get::<_, String>(4),
        "status": row.get::<_, String>(5),
        "stripe_id": row.get::<_, Option<String>>(6),
        "failure": row.get::<_, Option<String>>(7),
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
struct ReservationRequest {
    quantity: i32,
}

async fn reserve(
    State(app): State<App>,
    Path(item_id): Path<String>,
    request: Idempotent,
) -> Result<Response, Problem> {
    let wanted: ReservationRequest = request.json()?;
    if item_id.is_empty() || item_id.len() > 255 || item_id.chars().any(char::is_control) {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "urn:charge-service:invalid-reservation",
            "Invalid reservation",
            "the item id must be 1 to 255 bytes without control characters",
        ));
    }
    if wanted.quantity < 1 {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "urn:charge-service:invalid-reservation",
            "Invalid reservation",
            "quantity must be at least 1",
        ));
    }
    let mut conn = app.inner.pool.get().await?;
    let tx = conn.transaction().await?;
    let claim = match request.begin(&tx, &app.inner.reservations).await? {
        Started::New(claim) => claim,
        Started::Answered(answer) => return Ok(answer),
    };
    let reserved = tx
        .query_opt(queries::RESERVE_STOCK, &[&item_id, &wanted.quantity])
        .await?;
    let answer = match reserved {
        Some(row) => {
            let id = Uuid::now_v7();
            tx.execute(
                queries::INSERT_RESERVATION,
                &[&id, &item_id, &wanted.quantity],
            )
            .await?;
            let left: i32 = row.get(0);
            (
                StatusCode::CREATED,
                Json(json!({
                    "reservation_id": id,
                    "item_id": item_id,
                    "quantity": wanted.quantity,
                    "available": left,
                })),
            )
                .into_response()
        }
        None => {
            let available: Option<i32> = tx
                .query_opt(queries::AVAILABLE, &[&item_id])
                .await?
                .map(|r| r.get(0));
            // A business outcome, stored with the key: a retry is told the same thing.
            match available {
                Some(available) => {
                    let mut refusal = Problem::new(
                        StatusCode::CONFLICT,
                        "urn:charge-service:insufficient-stock",
                        "Insufficient stock",
                        format!(
                            "{} of {item_id} requested, {available} available",
                            wanted.quantity
                        ),
                    )
                    .to_json();
                    refusal["available"] = json!(available);
                    problem_response(StatusCode::CONFLICT, refusal)
                }
                None => problem_response(
                    StatusCode::NOT_FOUND,
                    Problem::blank(StatusCode::NOT_FOUND, format!("no item {item_id}")).to_json(),
                ),
            }
        }
    };
    request.complete(tx, claim, answer).await
}

fn problem_response(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, txoutbox_axum::PROBLEM_JSON)],
        body.to_string(),
    )
        .into_response()
}
