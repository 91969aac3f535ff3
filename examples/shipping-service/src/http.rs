//! `POST /webhooks`: a Standard Webhooks endpoint that applies each `charge.succeeded` event
//! once, in the transaction that records its `webhook-id` in the inbox.

use std::str::FromStr;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use example_support::check_text;
use serde::Deserialize;
use serde_json::json;
use txoutbox::inbox::Consumer;
use txoutbox_axum::{Problem, Received, SignedWebhook, WebhookReceiver};

/// The inbox's name for this endpoint: its message ids are the senders' `webhook-id`s.
pub const CONSUMER: &str = "shipping";

/// The event type that makes a shipment.
pub const EVENT_TYPE: &str = "charge.succeeded";

/// The largest webhook body accepted (an event is a few hundred bytes); larger is a 413.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Inserts the shipment of a charge, unless the charge has one (a second webhook about the
/// same charge under another id): `$1` charge id, `$2` email, `$3` webhook id.
const INSERT_SHIPMENT: &str = "INSERT INTO shipments (charge_id, email, webhook_id) \
     VALUES ($1, $2, $3) ON CONFLICT (charge_id) DO NOTHING RETURNING id";

/// The shipment a charge already has: `$1` charge id.
const SHIPMENT_OF_CHARGE: &str = "SELECT id FROM shipments WHERE charge_id = $1";

/// Where `CRASH_AT` aborts the process inside `POST /webhooks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CrashPoint {
    /// After `COMMIT`, before the answer is sent: the sender sees a lost connection and
    /// redelivers with the same `webhook-id`.
    AfterCommit,
}

impl CrashPoint {
    /// The `CRASH_AT` value.
    pub fn as_str(self) -> &'static str {
        match self {
            CrashPoint::AfterCommit => "after_commit",
        }
    }
}

impl FromStr for CrashPoint {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "after_commit" => Ok(CrashPoint::AfterCommit),
            _ => anyhow::bail!("CRASH_AT={s}: expected after_commit"),
        }
    }
}

/// What the handler shares.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    pool: deadpool_postgres::Pool,
    webhooks: WebhookReceiver,
    crash_at: Option<CrashPoint>,
}

impl FromRef<App> for WebhookReceiver {
    fn from_ref(app: &App) -> Self {
        app.inner.webhooks.clone()
    }
}

impl App {
    /// The endpoint over `pool`, accepting webhooks signed with any of `secrets` (`whsec_`),
    /// aborting at `crash_at` if set.
    pub fn new<'a>(
        pool: deadpool_postgres::Pool,
        secrets: impl IntoIterator<Item = &'a str>,
        crash_at: Option<CrashPoint>,
    ) -> anyhow::Result<Self> {
        let webhooks = WebhookReceiver::from_whsec(Consumer::new(CONSUMER)?, secrets)?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                webhooks,
                crash_at,
            }),
        })
    }

    fn crash_point(&self, point: CrashPoint) {
        example_support::crash_at(self.inner.crash_at, point, CrashPoint::as_str);
    }
}

/// The service's routes.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/webhooks", post(receive_webhook))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

/// The event body the charge service's webhook sink sends.
#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type")]
    event_type: String,
    #[serde(default)]
    data: serde_json::Value,
}

/// The data of a `charge.succeeded` event.
#[derive(Debug, Deserialize)]
struct ChargeSucceeded {
    charge_id: String,
    email: String,
}

/// A 422: an event this service cannot apply (permanent: the sender must not retry it).
fn invalid(detail: impl Into<String>) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "urn:shipping-service:invalid-event",
        "Invalid event",
        detail,
    )
}

/// The "your order ships" email of a charge's shipment.
fn ships_email(
    charge: &ChargeSucceeded,
    shipment_id: i64,
) -> Result<txoutbox::OutboxMessage, Problem> {
    txoutbox_email::Email::new(
        "Shipping service <shipping@shipping-service.example>",
        charge.email.clone(),
        "Your order ships",
    )
    .text(format!(
        "Your order (charge {}) ships today: shipment {shipment_id}.",
        charge.charge_id
    ))
    .into_outbox_message()
    .map_err(|e| invalid(e.to_string()))
}

/// A verified webhook: a duplicate is answered 200 at once; a new `charge.succeeded` writes its
/// shipment and enqueues its email with the inbox record; another event type is recorded and
/// acknowledged without effect. A malformed event is a 422 (permanent: the sender stops) and
/// writes nothing.
async fn receive_webhook(State(app): State<App>, hook: SignedWebhook) -> Result<Response, Problem> {
    let event: Event = hook.json()?;
    let charge = if event.event_type == EVENT_TYPE {
        let charge: ChargeSucceeded = serde_json::from_value(event.data)
            .map_err(|e| invalid(format!("a charge.succeeded event's data: {e}")))?;
        check_text("data.charge_id", &charge.charge_id, 255).map_err(invalid)?;
        check_text("data.email", &charge.email, 254).map_err(invalid)?;
        Some(charge)
    } else {
        None
    };
    let mut conn = app.inner.pool.get().await?;
    let tx = conn.transaction().await?;
    let mut claim = match hook.receive(&tx).await? {
        Received::New(claim) => claim,
        Received::Duplicate(answer) => return Ok(answer),
    };
    let Some(charge) = charge else {
        claim.complete(&tx).await?;
        tx.commit().await?;
        return Ok((StatusCode::OK, Json(json!({"ignored": event.event_type}))).into_response());
    };
    let inserted = tx
        .query_opt(
            INSERT_SHIPMENT,
            &[&charge.charge_id, &charge.email, &hook.id()],
        )
        .await?;
    let shipment_id: i64 = match inserted {
        Some(row) => {
            let id = row.try_get(0)?;
            claim.enqueue("ships-email", ships_email(&charge, id)?)?;
            id
        }
        None => tx
            .query_one(SHIPMENT_OF_CHARGE, &[&charge.charge_id])
            .await?
            .try_get(0)?,
    };
    claim.complete(&tx).await?;
    tx.commit().await?;
    app.crash_point(CrashPoint::AfterCommit);
    Ok((
        StatusCode::OK,
        Json(json!({"shipment_id": shipment_id, "charge_id": charge.charge_id})),
    )
        .into_response())
}
