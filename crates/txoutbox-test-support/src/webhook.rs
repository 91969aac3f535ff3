//! A webhook receiver on 127.0.0.1 for tests that run real relays: it answers each call as a
//! script says (status and `Retry-After`) and records what it was sent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// What the receiver answers a call to `path` that arrives `since` after the first call to it:
/// the status and an optional `Retry-After` in seconds.
type Script = dyn Fn(&str, Duration) -> (StatusCode, Option<u64>) + Send + Sync;

/// One call as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The request path, without its leading `/`.
    pub path: String,
    /// Since the receiver started.
    pub at: Duration,
    /// The `webhook-id` header.
    pub webhook_id: String,
    /// The `traceparent` header, if any.
    pub traceparent: Option<String>,
    /// The status answered.
    pub status: u16,
    /// The `Retry-After` answered, in seconds.
    pub retry_after: Option<u64>,
}

/// The receiver: serves `POST /{path}` until the test ends.
#[derive(Clone)]
pub struct WebhookReceiver {
    started: Instant,
    calls: Arc<Mutex<Vec<Call>>>,
    first: Arc<Mutex<HashMap<String, Instant>>>,
    script: Arc<Script>,
}

impl WebhookReceiver {
    /// Starts a receiver answering from `script`; the receiver and its address.
    pub async fn start(
        script: impl Fn(&str, Duration) -> (StatusCode, Option<u64>) + Send + Sync + 'static,
    ) -> Result<(Self, SocketAddr)> {
        let receiver = WebhookReceiver {
            started: Instant::now(),
            calls: Arc::default(),
            first: Arc::default(),
            script: Arc::new(script),
        };
        let router = axum::Router::new()
            .route("/{path}", axum::routing::post(receive))
            .with_state(receiver.clone());
        let (addr, _) = crate::serve_on_loopback(router).await?;
        Ok((receiver, addr))
    }

    /// Starts a receiver that answers `status` (with the `Retry-After` `retry_after`) to each
    /// call for which `failing(path, since)` holds (as in [`start`](Self::start)'s script), 200
    /// to the others.
    pub async fn failing_while(
        status: StatusCode,
        retry_after: Option<u64>,
        failing: impl Fn(&str, Duration) -> bool + Send + Sync + 'static,
    ) -> Result<(Self, SocketAddr)> {
        Self::start(move |path, since| {
            if failing(path, since) {
                (status, retry_after)
            } else {
                (StatusCode::OK, None)
            }
        })
        .await
    }

    /// Starts a receiver that answers 503 to the first `n` calls of each `(path, n)`, 200 to
    /// everything else.
    pub async fn failing_first(failures: &[(&str, u32)]) -> Result<(Self, SocketAddr)> {
        let left: Mutex<HashMap<String, u32>> = Mutex::new(
            failures
                .iter()
                .map(|(path, n)| ((*path).to_owned(), *n))
                .collect(),
        );
        Self::failing_while(StatusCode::SERVICE_UNAVAILABLE, None, move |path, _| {
            left.lock()
                .map(|mut left| match left.get_mut(path) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        true
                    }
                    _ => false,
                })
                .unwrap_or(false)
        })
        .await
    }

    /// Every call so far, in arrival order.
    pub fn all_calls(&self) -> Vec<Call> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The calls to `path`, in arrival order.
    pub fn calls(&self, path: &str) -> Vec<Call> {
        self.calls
            .lock()
            .map(|c| c.iter().filter(|c| c.path == path).cloned().collect())
            .unwrap_or_default()
    }

    /// `(path, traceparent)` of every call so far, in arrival order.
    pub fn seen(&self) -> Vec<(String, Option<String>)> {
        self.all_calls()
            .into_iter()
            .map(|c| (c.path, c.traceparent))
            .collect()
    }

    /// How many calls to `path` were answered 200.
    pub fn delivered(&self, path: &str) -> usize {
        self.calls(path).iter().filter(|c| c.status == 200).count()
    }

    /// Waits until `n` calls to `path` were answered 200, or `limit` passes; the count.
    pub async fn wait_delivered(&self, path: &str, n: usize, limit: Duration) -> usize {
        let start = Instant::now();
        while self.delivered(path) < n && start.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.delivered(path)
    }
}

async fn receive(
    State(receiver): State<WebhookReceiver>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    let now = Instant::now();
    let since = receiver
        .first
        .lock()
        .map(|mut first| now - *first.entry(path.clone()).or_insert(now))
        .unwrap_or_default();
    let (status, retry_after) = (receiver.script)(&path, since);
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if let Ok(mut calls) = receiver.calls.lock() {
        calls.push(Call {
            path,
            at: now - receiver.started,
            webhook_id: header("webhook-id").unwrap_or_default(),
            traceparent: header("traceparent"),
            status: status.as_u16(),
            retry_after,
        });
    }
    let mut response = status.into_response();
    if let Some(secs) = retry_after {
        response
            .headers_mut()
            .insert("retry-after", HeaderValue::from(secs));
    }
    response
}

/// POSTs `body` to `url` as a Standard Webhooks sender does: `webhook-id` `id`,
/// `webhook-timestamp` `timestamp` and the signature by `key` of the three.
pub async fn post_signed(
    url: &str,
    key: &txoutbox::standard_webhooks::WebhookSecret,
    id: &str,
    timestamp: i64,
    body: &str,
) -> Result<reqwest::Response> {
    let signature = txoutbox::standard_webhooks::sign(key, id, timestamp, body.as_bytes());
    Ok(crate::http_client()?
        .post(url)
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await?)
}
