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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// The secret key the fake accepts (a test key: it starts with `sk_test_`).
pub const FAKE_SECRET_KEY: &str = "sk_test_txoutbox_fake_stripe";

/// Test payment methods that decline, as on Stripe: (payment method, code, decline_code, message).
const DECLINING_PAYMENT_METHODS: &[(&str, &str, &str, &str)] = &[
    (
        "pm_card_chargeDeclined",
        "card_declined",
        "generic_decline",
        "Your card was declined.",
    ),
    (
        "pm_card_visa_chargeDeclined",
        "card_declined",
        "generic_decline",
        "Your card was declined.",
    ),
    (
        "pm_card_chargeDeclinedInsufficientFunds",
        "card_declined",
        "insufficient_funds",
        "Your card has insufficient funds.",
    ),
    (
        "pm_card_chargeDeclinedFraudulent",
        "card_declined",
        "fraudulent",
        "Your card was declined.",
    ),
    (
        "pm_card_chargeDeclinedExpiredCard",
        "expired_card",
        "expired_card",
        "Your card has expired.",
    ),
    (
        "pm_card_chargeDeclinedIncorrectCvc",
        "incorrect_cvc",
        "incorrect_cvc",
        "Your card's security code is incorrect.",
    ),
];

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
            .route("/v1/payment_intents", post(create_payment_intent))
            .route("/v1/payment_intents/{id}", get(retrieve_payment_intent))
            .route("/v1/refunds", post(create_refund))
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

type Endpoint = fn(&mut Store, &[(String, String)]) -> Outcome;

async fn create_payment_intent(
    State(store): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    post_endpoint(store, "/v1/payment_intents", headers, body, create_intent).await
}

async fn create_refund(State(store): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    post_endpoint(store, "/v1/refunds", headers, body, refund).await
}

async fn retrieve_payment_intent(
    State(store): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/v1/payment_intents/{id}");
    let answer = gate(&store, &headers).map_or_else(
        |refused| refused,
        |()| {
            let found = lock(&store)
                .intents
                .iter()
                .find(|i| i["id"] == id.as_str())
                .cloned();
            match found {
                Some(intent) => Answer::new(StatusCode::OK, intent),
                None => ApiError::new(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    Some("resource_missing"),
                    format!("No such payment_intent: '{id}'"),
                )
                .with_param("intent")
                .into(),
            }
        },
    );
    finish(&store, "GET", &path, &headers, Vec::new(), answer)
}

async fn unknown_url(
    State(store): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let answer = ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        None,
        format!(
            "Unrecognized request URL ({method}: {}). (This fake Stripe API serves only \
             POST /v1/payment_intents, GET /v1/payment_intents/{{id}} and POST /v1/refunds.)",
            uri.path()
        ),
    );
    finish(
        &store,
        method.as_str(),
        uri.path(),
        &headers,
        Vec::new(),
        answer.into(),
    )
}

/// A response about to be recorded and sent.
struct Answer {
    status: StatusCode,
    body: Value,
    /// `Retry-After`, in whole seconds.
    retry_after: Option<u64>,
    replayed: bool,
}

impl From<ApiError> for Answer {
    fn from(e: ApiError) -> Self {
        Self {
            status: e.status,
            body: e.body,
            retry_after: None,
            replayed: false,
        }
    }
}

impl Answer {
    fn new(status: StatusCode, body: Value) -> Self {
        Self {
            status,
            body,
            retry_after: None,
            replayed: false,
        }
    }
}

/// What every request passes first: an injected failure, then authentication.
fn gate(store: &Shared, headers: &HeaderMap) -> Result<(), Answer> {
    if let Some(failure) = lock(store).failures.pop_front() {
        let mut answer = Answer::from(injected(&failure));
        answer.retry_after = failure
            .retry_after
            .map(|after| after.as_secs() + u64::from(after.subsec_nanos() > 0));
        return Err(answer);
    }
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth.and_then(|a| a.strip_prefix("Bearer ")) {
        Some(key) if key == FAKE_SECRET_KEY => Ok(()),
        Some(key) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            None,
            format!(
                "Invalid API Key provided: sk_****{}",
                key.get(key.len().saturating_sub(4)..).unwrap_or("")
            ),
        )
        .into()),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            None,
            "You did not provide an API key. You need to provide your API key in the \
             Authorization header, using Bearer auth (e.g. 'Authorization: Bearer \
             YOUR_SECRET_KEY').",
        )
        .into()),
    }
}

fn injected(failure: &InjectedFailure) -> ApiError {
    match failure.status {
        StatusCode::TOO_MANY_REQUESTS => ApiError::new(
            failure.status,
            "invalid_request_error",
            Some("rate_limit"),
            "Request rate limit exceeded. Learn more about rate limits here \
             https://stripe.com/docs/rate-limits. (fake Stripe: injected)",
        ),
        status if status.is_server_error() => ApiError::new(
            status,
            "api_error",
            None,
            "Something went wrong on Stripe's end. (fake Stripe: injected)",
        ),
        status => ApiError::new(
            status,
            "invalid_request_error",
            None,
            format!("fake Stripe: injected {status}"),
        ),
    }
}

fn key_in_use(key: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "idempotency_error",
        Some("idempotency_key_in_use"),
        format!(
            "There is currently another in-progress request using this Idempotency-Key (that \
             probably means you submitted twice, and the other request is still going \
             through): {key}. Please try again later."
        ),
    )
}

fn key_reused(key: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "idempotency_error",
        None,
        format!(
            "Keys for idempotent requests can only be used with the same parameters they were \
             first used with. Try using a key other than '{key}' if you meant to execute a \
             different request."
        ),
    )
}

/// A POST endpoint behind the gate and the idempotency layer.
async fn post_endpoint(
    store: Shared,
    path: &'static str,
    headers: HeaderMap,
    body: Bytes,
    endpoint: Endpoint,
) -> Response {
    let params: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let answer = admit_and_run(&store, path, &headers, &body, &params, endpoint).await;
    finish(&store, "POST", path, &headers, params, answer)
}

async fn admit_and_run(
    store: &Shared,
    path: &'static str,
    headers: &HeaderMap,
    body: &Bytes,
    params: &[(String, String)],
    endpoint: Endpoint,
) -> Answer {
    if let Err(refused) = gate(store, headers) {
        return refused;
    }
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    if !form && !body.is_empty() {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            "Invalid request: Stripe takes application/x-www-form-urlencoded bodies.",
        )
        .into();
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut canonical = params.to_vec();
    canonical.sort();
    if let Some(key) = &key {
        // Check and take the key under one lock: two concurrent requests cannot both run.
        let mut guard = lock(store);
        match guard.idempotency.get(key) {
            Some(CachedResult::InProgress) => return key_in_use(key).into(),
            Some(CachedResult::Done {
                endpoint,
                params: first,
                status,
                body,
            }) => {
                if endpoint == path && *first == canonical {
                    let mut replay = Answer::new(*status, body.clone());
                    replay.replayed = true;
                    return replay;
                }
                return key_reused(key).into();
            }
            None => {
                guard
                    .idempotency
                    .insert(key.clone(), CachedResult::InProgress);
            }
        }
    }
    // Run the endpoint on a task of its own: a client that gives up does not undo the effect.
    let run = {
        let (store, params, key) = (store.clone(), params.to_vec(), key.clone());
        tokio::spawn(async move {
            let latency = lock(&store).latency;
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            let mut guard = lock(&store);
            let outcome = endpoint(&mut guard, &params);
            if let Some(key) = key {
                if outcome.cache {
                    guard.idempotency.insert(
                        key,
                        CachedResult::Done {
                            endpoint: path.to_owned(),
                            params: canonical,
                            status: outcome.status,
                            body: outcome.body.clone(),
                        },
                    );
                } else {
                    guard.idempotency.remove(&key);
                }
            }
            outcome
        })
    };
    match run.await {
        Ok(outcome) => Answer::new(outcome.status, outcome.body),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            None,
            format!("fake Stripe: the endpoint failed: {e}"),
        )
        .into(),
    }
}

/// Records the request and builds the response with Stripe's headers.
fn finish(
    store: &Shared,
    method: &str,
    path: &str,
    headers: &HeaderMap,
    params: Vec<(String, String)>,
    answer: Answer,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    lock(store).seen.push(SeenRequest {
        method: method.to_owned(),
        path: path.to_owned(),
        idempotency_key: key.clone(),
        params,
        status: answer.status.as_u16(),
        replayed: answer.replayed,
    });
    let status = answer.status;
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        answer.body.to_string(),
    )
        .into_response();
    let out = response.headers_mut();
    if let Ok(id) = HeaderValue::from_str(&new_id("req")) {
        out.insert("request-id", id);
    }
    if let Some(key) = key.and_then(|k| HeaderValue::from_str(&k).ok()) {
        out.insert("idempotency-key", key);
    }
    if answer.replayed {
        out.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if let Some(secs) = answer.retry_after {
        out.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        out.insert("stripe-should-retry", HeaderValue::from_static("true"));
    }
    response
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `metadata[k]=v` pairs as a map (Stripe's bracket encoding of a hash).
fn metadata(params: &[(String, String)]) -> BTreeMap<String, String> {
    params
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("metadata[")
                .and_then(|rest| rest.strip_suffix(']'))
                .map(|name| (name.to_owned(), v.clone()))
        })
        .collect()
}

fn missing(name: &str) -> ApiError {
    ApiError::invalid(
        "parameter_missing",
        format!("Missing required param: {name}."),
    )
    .with_param(name)
}

fn required<'a>(params: &'a [(String, String)], name: &str) -> Result<&'a str, ApiError> {
    param(params, name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| missing(name))
}

fn integer(params: &[(String, String)], name: &str) -> Result<Option<i64>, ApiError> {
    match param(params, name) {
        None => Ok(None),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            Ok(_) => Err(ApiError::invalid(
                "parameter_invalid_integer",
                format!("This value must be greater than or equal to 1 ({name})."),
            )
            .with_param(name)),
            Err(_) => Err(ApiError::invalid(
                "parameter_invalid_integer",
                format!("Invalid integer: {v}"),
            )
            .with_param(name)),
        },
    }
}

fn create_intent(store: &mut Store, params: &[(String, String)]) -> Outcome {
    match intent_from(params) {
        Err(e) => Outcome::rejected(e),
        Ok((mut intent, decline)) => {
            let Some((code, decline_code, message)) = decline else {
                store.intents.push(intent.clone());
                return Outcome::ok(intent);
            };
            let charge = new_id("ch");
            let error = json!({
                "type": "card_error",
                "code": code,
                "decline_code": decline_code,
                "message": message,
                "charge": charge,
                "doc_url": format!("https://stripe.com/docs/error-codes/{code}"),
            });
            intent["last_payment_error"] = error.clone();
            intent["latest_charge"] = json!(charge);
            store.intents.push(intent.clone());
            let mut error = error;
            error["payment_intent"] = intent;
            Outcome {
                status: StatusCode::PAYMENT_REQUIRED,
                body: json!({ "error": error }),
                cache: true,
            }
        }
    }
}

type Decline = Option<(&'static str, &'static str, &'static str)>;

fn intent_from(params: &[(String, String)]) -> Result<(Value, Decline), ApiError> {
    let amount = integer(params, "amount")?.ok_or_else(|| missing("amount"))?;
    let currency = required(params, "currency")?;
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_lowercase()) {
        return Err(ApiError::invalid(
            "parameter_invalid_string",
            format!("Invalid currency: {currency}. Stripe currencies are three-letter ISO codes in lowercase."),
        )
        .with_param("currency"));
    }
    let customer = param(params, "customer");
    if let Some(c) = customer.filter(|c| !c.starts_with("cus_")) {
        return Err(
            ApiError::invalid("resource_missing", format!("No such customer: '{c}'"))
                .with_param("customer"),
        );
    }
    let payment_method = param(params, "payment_method");
    if let Some(pm) = payment_method.filter(|pm| !pm.starts_with("pm_")) {
        return Err(ApiError::invalid(
            "resource_missing",
            format!("No such PaymentMethod: '{pm}'"),
        )
        .with_param("payment_method"));
    }
    let confirm = match param(params, "confirm") {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "parameter_invalid_boolean",
                format!("Invalid boolean: {other}"),
            )
            .with_param("confirm"))
        }
    };
    let id = new_id("pi");
    let mut decline = None;
    let status = match (confirm, payment_method) {
        (true, None) => {
            return Err(ApiError::invalid(
                "payment_intent_unexpected_state",
                "You cannot confirm this PaymentIntent because it's missing a payment method. \
                 Specify a payment method (payment_method) when confirming.",
            )
            .with_param("payment_method"))
        }
        (true, Some(pm)) => {
            decline = DECLINING_PAYMENT_METHODS
                .iter()
                .find(|(name, ..)| *name == pm)
                .map(|(_, code, decline_code, message)| (*code, *decline_code, *message));
            // A declined confirmation leaves the intent waiting for another payment method.
            if decline.is_some() {
                "requires_payment_method"
            } else {
                "succeeded"
            }
        }
        (false, Some(_)) => "requires_confirmation",
        (false, None) => "requires_payment_method",
    };
    let succeeded = status == "succeeded";
    let intent = json!({
        "id": id,
        "object": "payment_intent",
        "amount": amount,
        "amount_capturable": 0,
        "amount_received": if succeeded { amount } else { 0 },
        "application": null,
        "application_fee_amount": null,
        "automatic_payment_methods": null,
        "canceled_at": null,
        "cancellation_reason": null,
        "capture_method": param(params, "capture_method").unwrap_or("automatic"),
        "client_secret": format!("{id}_secret_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]),
        "confirmation_method": "automatic",
        "created": now(),
        "currency": currency,
        "customer": customer,
        "description": param(params, "description"),
        "last_payment_error": null,
        "latest_charge": if succeeded { json!(new_id("ch")) } else { Value::Null },
        "livemode": false,
        "metadata": metadata(params),
        "next_action": null,
        "on_behalf_of": null,
        "payment_method": payment_method,
        "payment_method_types": ["card"],
        "processing": null,
        "receipt_email": null,
        "review": null,
        "setup_future_usage": null,
        "shipping": null,
        "statement_descriptor": null,
        "statement_descriptor_suffix": null,
        "status": status,
        "transfer_data": null,
        "transfer_group": null,
    });
    Ok((intent, decline))
}

fn refund(store: &mut Store, params: &[(String, String)]) -> Outcome {
    match refund_from(store, params) {
        Ok(refund) => {
            store.refunds.push(refund.clone());
            Outcome::ok(refund)
        }
        Err(e) => Outcome::rejected(e),
    }
}

fn refund_from(store: &mut Store, params: &[(String, String)]) -> Result<Value, ApiError> {
    if param(params, "charge").is_some() && param(params, "payment_intent").is_none() {
        return Err(ApiError::invalid(
            "parameter_unknown",
            "This fake Stripe API refunds by payment_intent only.",
        )
        .with_param("charge"));
    }
    let intent_id = required(params, "payment_intent")?;
    let intent = store
        .intents
        .iter()
        .find(|i| i["id"] == intent_id)
        .cloned()
        .ok_or_else(|| {
            ApiError::invalid(
                "resource_missing",
                format!("No such payment_intent: '{intent_id}'"),
            )
            .with_param("payment_intent")
        })?;
    if intent["status"] != "succeeded" {
        return Err(ApiError::invalid(
            "charge_not_refundable",
            format!(
                "This PaymentIntent ({intent_id}) does not have a successful charge to refund."
            ),
        )
        .with_param("payment_intent"));
    }
    let received = intent["amount_received"].as_i64().unwrap_or(0);
    let already = store.refunded.get(intent_id).copied().unwrap_or(0);
    let left = received - already;
    if left <= 0 {
        return Err(ApiError::invalid(
            "charge_already_refunded",
            format!(
                "Charge {} has already been refunded.",
                intent["latest_charge"].as_str().unwrap_or("")
            ),
        ));
    }
    let amount = integer(params, "amount")?.unwrap_or(left);
    if amount > left {
        return Err(ApiError::invalid(
            "amount_too_large",
            format!(
                "Refund amount ({amount}) is greater than unrefunded amount on charge ({left})"
            ),
        )
        .with_param("amount"));
    }
    store
        .refunded
        .insert(intent_id.to_owned(), already + amount);
    Ok(json!({
        "id": new_id("re"),
        "object": "refund",
        "amount": amount,
        "balance_transaction": null,
        "charge": intent["latest_charge"].clone(),
        "created": now(),
        "currency": intent["currency"].clone(),
        "destination_details": null,
        "metadata": metadata(params),
        "payment_intent": intent_id,
        "reason": param(params, "reason"),
        "receipt_number": null,
        "source_transfer_reversal": null,
        "status": "succeeded",
        "transfer_reversal": null,
    }))
}

fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..24]
    )
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
