//! A **FAKE** Stripe API, for tests and demos. It is not Stripe, talks to no one, and moves no
//! money. It exists because Stripe cannot be reached from here; everything else in this project is
//! tested against real servers.
//!
//! It serves, on a loopback port inside the caller's tokio runtime, the few endpoints the Stripe
//! sink calls, and behaves like Stripe where a sink's correctness depends on it:
//!
//! - `POST /v1/payment_intents` and `POST /v1/refunds` take Stripe's form encoding
//!   (`application/x-www-form-urlencoded`, nested keys in brackets: `metadata[order]=42`); any
//!   other content type is a 400. `GET /v1/payment_intents/{id}` reads an intent back.
//! - `Authorization: Bearer <key>` must carry [`FakeStripe::secret_key`]: a missing or other key is
//!   a 401 with Stripe's error shape `{"error":{"type":..,"code":..,"message":..}}`.
//! - The `Idempotency-Key` cache works as Stripe documents it: the same key with the same
//!   parameters (compared as a set of decoded pairs, so their order does not matter) answers the
//!   first result again, with `Idempotent-Replayed: true`, and creates nothing; the same key with
//!   other parameters or another endpoint is a 400 `idempotency_error`; the same key while its
//!   first request is still running is a 409 `idempotency_key_in_use`. Results are cached only
//!   once an endpoint ran (created something or declined a card), not for an authentication or
//!   validation failure. A request keeps running when its client goes away (a client timeout
//!   does not undo the effect), as on Stripe.
//! - Confirming with Stripe's declining test payment methods (`pm_card_chargeDeclined`,
//!   `pm_card_chargeDeclinedInsufficientFunds`, `pm_card_chargeDeclinedExpiredCard`, ...) answers
//!   402 `card_error` with the card's `code` and `decline_code`; the intent is still created, with
//!   status `requires_payment_method` and the error as `last_payment_error`. Any other `pm_...`
//!   succeeds.
//! - On demand ([`FakeStripe::fail_next`]) the next requests answer 500, 429 or any status before
//!   reaching an endpoint (like Stripe's rate limiter or a front-end failure): nothing is created,
//!   nothing is cached, optionally with a `Retry-After`. [`FakeStripe::set_latency`] makes
//!   endpoints slow, to provoke client timeouts and concurrent requests with one key.
//! - Tests inspect what happened: [`FakeStripe::intents`], [`FakeStripe::refunds`],
//!   [`FakeStripe::created_count`] and [`FakeStripe::requests`] (each with its idempotency key,
//!   status and whether it was a replay).
//!
//! What it does **not** do: card networks, 3-D Secure, `requires_action`, captures, customers or
//! payment methods as objects (any `cus_...`/`pm_...` id exists), charges beyond an id, webhooks,
//! pagination, `expand`, API versions, Connect accounts, key expiry after 24 h, or Stripe's full
//! validation (only the parameters below are checked, and its error codes for malformed
//! parameters are close to Stripe's, not guaranteed to be the same). Unknown parameters are
//! accepted and kept for the idempotency comparison. Objects carry the fields Stripe's
//! PaymentIntent and Refund objects require (so typed clients parse them), with nulls elsewhere.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::oneshot;

mod http;
mod resources;

use http::{post_route, retrieve_payment_intent, unknown_url};
use resources::param;
use resources::{create_intent, refund};

/// The secret key the fake accepts (a test key: it starts with `sk_test_`).
pub const FAKE_SECRET_KEY: &str = "sk_test_txoutbox_fake_stripe";

/// One request the fake answered, for a test to inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// `GET` or `POST`.
    pub method: String,
    /// The path, such as `/v1/payment_intents`.
    pub path: String,
    /// The `Idempotency-Key` header, if sent.
    pub idempotency_key: Option<String>,
    /// The decoded form parameters, in the order sent.
    pub params: Vec<(String, String)>,
    /// The status the fake answered.
    pub status: u16,
    /// True when the answer was an idempotent replay of an earlier result.
    pub replayed: bool,
}

impl SeenRequest {
    /// The value of parameter `name` (`amount`, `metadata[order]`), if sent.
    pub fn param(&self, name: &str) -> Option<&str> {
        param(&self.params, name)
    }
}

/// A failure answered before any endpoint runs.
#[derive(Debug, Clone)]
struct InjectedFailure {
    status: StatusCode,
    retry_after: Option<Duration>,
}

/// What the idempotency layer holds for one key.
#[derive(Debug, Clone)]
enum CachedResult {
    /// The first request with this key is still running.
    InProgress,
    /// The first request's answer, replayed for the same parameters.
    Done {
        endpoint: String,
        params: Vec<(String, String)>,
        status: StatusCode,
        body: Value,
    },
}

#[derive(Debug, Default)]
struct Store {
    intents: Vec<Value>,
    /// Amount refunded so far, by intent id.
    refunded: HashMap<String, i64>,
    refunds: Vec<Value>,
    idempotency: HashMap<String, CachedResult>,
    failures: VecDeque<InjectedFailure>,
    latency: Duration,
    seen: Vec<SeenRequest>,
}

type Shared = Arc<Mutex<Store>>;

fn lock(store: &Shared) -> MutexGuard<'_, Store> {
    // A panic while holding the lock leaves the data usable; keep serving rather than cascade.
    store
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running fake Stripe API. Dropping it stops the server.
pub struct FakeStripe {
    addr: SocketAddr,
    store: Shared,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeStripe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeStripe")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeStripe {
    /// Starts the fake on a free port of 127.0.0.1, on the current tokio runtime.
    pub async fn start() -> Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts the fake on `addr` (port 0 picks a free one), for a demo that wants a fixed port.
    pub async fn start_on(addr: SocketAddr) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the fake Stripe API to {addr}"))?;
        let addr = listener.local_addr()?;
        let store: Shared = Arc::default();
        let app = Router::new()
            .route(
                "/v1/payment_intents",
                post_route("/v1/payment_intents", create_intent),
            )
            .route("/v1/payment_intents/{id}", get(retrieve_payment_intent))
            .route("/v1/refunds", post_route("/v1/refunds", refund))
            .fallback(unknown_url)
            .with_state(store.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                eprintln!("fake Stripe API stopped: {e}");
            }
        });
        Ok(Self {
            addr,
            store,
            stop: Some(stop),
            task,
        })
    }

    /// The API base to configure a client with, such as `http://127.0.0.1:41234`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the fake listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The only secret key the fake accepts ([`FAKE_SECRET_KEY`]).
    pub fn secret_key(&self) -> &'static str {
        FAKE_SECRET_KEY
    }

    /// The next `n` requests answer `status` (500, 429, ...) before reaching an endpoint.
    pub fn fail_next(&self, status: u16, n: usize) {
        self.inject(status, n, None);
    }

    /// Like [`FakeStripe::fail_next`], with a `Retry-After` header (whole seconds, rounded up).
    pub fn fail_next_with_retry_after(&self, status: u16, n: usize, retry_after: Duration) {
        self.inject(status, n, Some(retry_after));
    }

    fn inject(&self, status: u16, n: usize, retry_after: Option<Duration>) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut store = lock(&self.store);
        for _ in 0..n {
            store.failures.push_back(InjectedFailure {
                status,
                retry_after,
            });
        }
    }

    /// Every endpoint takes at least `latency` from now on (the key is held meanwhile).
    pub fn set_latency(&self, latency: Duration) {
        lock(&self.store).latency = latency;
    }

    /// Every PaymentIntent created, in creation order, as Stripe's JSON objects.
    pub fn intents(&self) -> Vec<Value> {
        lock(&self.store).intents.clone()
    }

    /// The PaymentIntent with this id, as it is now.
    pub fn intent(&self, id: &str) -> Option<Value> {
        lock(&self.store)
            .intents
            .iter()
            .find(|i| i["id"] == id)
            .cloned()
    }

    /// Every Refund created, in creation order.
    pub fn refunds(&self) -> Vec<Value> {
        lock(&self.store).refunds.clone()
    }

    /// How many objects (intents and refunds) were created; replays create none.
    pub fn created_count(&self) -> usize {
        let store = lock(&self.store);
        store.intents.len() + store.refunds.len()
    }

    /// Whether a request with idempotency key `key` is running now (holding the key: another
    /// with it is a 409 `idempotency_key_in_use`).
    pub fn key_in_progress(&self, key: &str) -> bool {
        matches!(
            lock(&self.store).idempotency.get(key),
            Some(CachedResult::InProgress)
        )
    }

    /// Every request answered so far, in the order answered.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.store).seen.clone()
    }

    /// Waits until at least `n` requests were answered, or `limit` passes; returns the count.
    pub async fn wait_for_requests(&self, n: usize, limit: Duration) -> usize {
        let start = Instant::now();
        loop {
            let count = lock(&self.store).seen.len();
            if count >= n || start.elapsed() >= limit {
                return count;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the server and waits for it to close.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for FakeStripe {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// A Stripe error: status plus the `error` object.
#[derive(Debug, Clone)]
struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    fn new(status: StatusCode, kind: &str, code: Option<&str>, message: impl Into<String>) -> Self {
        let mut error = json!({ "type": kind, "message": message.into() });
        if let Some(code) = code {
            error["code"] = json!(code);
            error["doc_url"] = json!(format!("https://stripe.com/docs/error-codes/{code}"));
        }
        Self {
            status,
            body: json!({ "error": error }),
        }
    }

    fn invalid(code: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some(code),
            message,
        )
    }

    fn with_param(mut self, param: &str) -> Self {
        self.body["error"]["param"] = json!(param);
        self
    }
}

/// What an endpoint produced: an answer, and whether the idempotency layer keeps it.
struct Outcome {
    status: StatusCode,
    body: Value,
    cache: bool,
}

impl Outcome {
    fn ok(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            body,
            cache: true,
        }
    }

    /// A validation failure: the endpoint did not run, so nothing is cached (as on Stripe).
    fn rejected(error: ApiError) -> Self {
        Self {
            status: error.status,
            body: error.body,
            cache: false,
        }
    }
}
