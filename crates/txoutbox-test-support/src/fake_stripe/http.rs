//! The HTTP side of the fake: routing, the gate every request passes (injected failures,
//! authentication), the idempotency layer, and the headers Stripe sends back.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use serde_json::Value;

use super::resources::new_id;
use super::{
    lock, ApiError, CachedResult, InjectedFailure, Outcome, SeenRequest, Shared, Store,
    FAKE_SECRET_KEY,
};

pub(super) type Endpoint = fn(&mut Store, &[(String, String)]) -> Outcome;

/// The route of a POST endpoint at `path`: `endpoint` run on the form body, behind the gate and
/// the idempotency layer.
pub(super) fn post_route(path: &'static str, endpoint: Endpoint) -> MethodRouter<Shared> {
    post(
        move |State(store): State<Shared>, headers: HeaderMap, body: Bytes| {
            post_endpoint(store, path, headers, body, endpoint)
        },
    )
}

pub(super) async fn retrieve_payment_intent(
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

pub(super) async fn unknown_url(
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
pub(super) struct Answer {
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
pub(super) fn gate(store: &Shared, headers: &HeaderMap) -> Result<(), Answer> {
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

pub(super) fn injected(failure: &InjectedFailure) -> ApiError {
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

pub(super) fn key_in_use(key: &str) -> ApiError {
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

pub(super) fn key_reused(key: &str) -> ApiError {
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

pub(super) async fn admit_and_run(
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
pub(super) fn finish(
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
