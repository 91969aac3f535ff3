//! A client for idempotent HTTP endpoints: one key per logical operation, the same key on every
//! retry, retries with backoff until a deadline.
//!
//! ```no_run
//! use txoutbox_client::{IdempotentClient, RetryPolicy};
//!
//! # async fn demo() -> Result<(), txoutbox_client::ClientError> {
//! let client = IdempotentClient::new(RetryPolicy::default())?;
//! let operation = client.operation();          // one key (UUIDv7) for this charge
//! let outcome = operation
//!     .post_json("http://127.0.0.1:3000/charge", &serde_json::json!({"amount": 2000}))
//!     .await?;
//! println!("{} after {} attempts (key {})", outcome.status, outcome.attempts, outcome.key);
//! # Ok(()) }
//! ```
//!
//! What is retried, always with the operation's key: timeouts, connection errors (refused,
//! reset, a response cut off mid-body), `409 Conflict` with `Retry-After` (the first try is still
//! running; a 409 without it is a business answer such as "out of stock", and final), `429` and
//! every 5xx. The wait doubles from [`RetryPolicy::initial_backoff`] up to
//! [`RetryPolicy::max_backoff`] with jitter, or follows `Retry-After`; no attempt starts after the
//! deadline. Any other answer (2xx, 4xx such as 400, 402 or 422) is final and returned. A
//! response lost on the way back costs nothing: the retry is answered with the stored response
//! (`Idempotent-Replayed: true`).
//!
//! # Keys in browser flows
//!
//! The key belongs to the logical operation, not to the HTTP request: generate it when the form
//! is rendered, keep it in `sessionStorage` (keyed by the form) so a double click, a reload or a
//! resubmit after a network error sends the same key, and drop it only after a final answer, when
//! the user starts a new operation. A key made per click makes every click a new charge.
//! `examples/charge-service` serves such a page. Outside a browser, persist the key next to the
//! job (a database row, a file) before the first attempt when the process itself may restart:
//! [`IdempotentClient::operation_with_key`] resumes it.
//!
//! Layout: one module: [`RetryPolicy`], [`IdempotentClient`], [`Operation`], [`Outcome`],
//! [`ClientError`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use rand::Rng;

/// The header the key travels in, as a Structured Field String (RFC 8941), the form
/// draft-ietf-httpapi-idempotency-key-header defines: `Idempotency-Key: "0190f5e2-…"`.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// `key` as an RFC 8941 sf-string: quoted, with `"` and `\` escaped.
pub fn sf_string(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// When and how long to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Give up when this much time has passed since the first attempt (default 30 s).
    pub deadline: Duration,
    /// One attempt's timeout, cut to what is left of the deadline (default 10 s).
    pub attempt_timeout: Duration,
    /// The first wait (default 100 ms); it doubles per attempt.
    pub initial_backoff: Duration,
    /// The longest wait (default 2 s).
    pub max_backoff: Duration,
    /// At most this many attempts (default 20).
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            max_attempts: 20,
        }
    }
}

/// Why an operation ended without a final answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
    /// The body could not be serialised.
    #[error("serialising the request body: {0}")]
    Body(#[from] serde_json::Error),
    /// Every attempt failed retryably and the deadline or the attempt limit was reached. The
    /// operation may or may not have happened: retry later with the same key to find out.
    #[error("gave up after {attempts} attempts (key {key}): {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The operation's key, to retry later.
        key: String,
        /// What the last attempt saw.
        last: String,
        /// The last retryable answer, if the last attempt got one (a 503, a 409).
        last_status: Option<StatusCode>,
    },
    /// A request that cannot be sent at all (a bad URL).
    #[error("the request cannot be sent: {0}")]
    Request(#[source] reqwest::Error),
}

/// The final answer of an operation.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The final status.
    pub status: StatusCode,
    /// The final headers.
    pub headers: HeaderMap,
    /// The final body.
    pub body: Bytes,
    /// HTTP attempts made (1 when the first one was final).
    pub attempts: u32,
    /// The key every attempt carried.
    pub key: String,
}

impl Outcome {
    /// The body parsed as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// True when the server answered from its stored response (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

/// A reqwest client with a retry policy.
#[derive(Debug, Clone)]
pub struct IdempotentClient {
    http: reqwest::Client,
    policy: RetryPolicy,
}

impl IdempotentClient {
    /// A client with its own connection pool.
    pub fn new(policy: RetryPolicy) -> Result<Self, ClientError> {
        install_crypto_provider();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(ClientError::Build)?;
        Ok(Self { http, policy })
    }

    /// A client over an existing reqwest client (its timeouts still apply).
    pub fn with_http(http: reqwest::Client, policy: RetryPolicy) -> Self {
        Self { http, policy }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// A new logical operation with a fresh key (UUIDv7).
    pub fn operation(&self) -> Operation<'_> {
        self.operation_with_key(uuid::Uuid::now_v7().to_string())
    }

    /// Resumes an operation whose key was persisted before (a restarted job, a stored form).
    pub fn operation_with_key(&self, key: impl Into<String>) -> Operation<'_> {
        Operation {
            client: self,
            key: key.into(),
        }
    }
}

/// One logical operation: every request sent through it carries its key.
#[derive(Debug, Clone)]
pub struct Operation<'c> {
    client: &'c IdempotentClient,
    key: String,
}

impl Operation<'_> {
    /// The operation's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// POSTs `body` as JSON, retrying as the policy says.
    pub async fn post_json<T: serde::Serialize + ?Sized>(
        &self,
        url: &str,
        body: &T,
    ) -> Result<Outcome, ClientError> {
        let body = Bytes::from(serde_json::to_vec(body)?);
        self.send(Method::POST, url, body).await
    }

    /// Sends `method url` with `body` (as `application/json`), retrying as the policy says.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        body: Bytes,
    ) -> Result<Outcome, ClientError> {
        let policy = &self.client.policy;
        let started = Instant::now();
        let mut attempts = 0u32;
        let mut wait = policy.initial_backoff;
        loop {
            attempts += 1;
            let left = policy.deadline.saturating_sub(started.elapsed());
            let timeout = policy
                .attempt_timeout
                .min(left)
                .max(Duration::from_millis(1));
            let (last, last_status, retry_after) = match self
                .attempt(method.clone(), url, body.clone(), timeout)
                .await
            {
                Ok(outcome) if !retryable(outcome.status, &outcome.headers) => {
                    return Ok(Outcome {
                        attempts,
                        ..outcome
                    });
                }
                Ok(outcome) => (
                    format!("answered {}", outcome.status),
                    Some(outcome.status),
                    retry_after(&outcome.headers),
                ),
                Err(e) if e.is_builder() => return Err(ClientError::Request(e)),
                Err(e) => (error_chain(&e), None, None),
            };
            tracing::debug!(attempt = attempts, key = %self.key, %last, "retrying");
            let jittered = wait.mul_f64(rand::rng().random_range(0.5..=1.0));
            let pause = retry_after.unwrap_or(jittered);
            if attempts >= policy.max_attempts || started.elapsed() + pause >= policy.deadline {
                return Err(ClientError::GaveUp {
                    attempts,
                    key: self.key.clone(),
                    last,
                    last_status,
                });
            }
            tokio::time::sleep(pause).await;
            wait = (wait * 2).min(policy.max_backoff);
        }
    }

    async fn attempt(
        &self,
        method: Method,
        url: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Outcome, reqwest::Error> {
        let response = self
            .client
            .http
            .request(method, url)
            .header(IDEMPOTENCY_KEY, sf_string(&self.key))
            .header(http::header::CONTENT_TYPE, "application/json")
            .timeout(timeout)
            .body(body)
            .send()
            .await?;
        let status = response.status();
        let headers = response.headers().clone();
        // A body cut off is as lost as no answer: the retry asks again.
        let body = response.bytes().await?;
        Ok(Outcome {
            status,
            headers,
            body,
            attempts: 0,
            key: self.key.clone(),
        })
    }
}

/// 409 with `Retry-After` (the key is in flight), 429 and 5xx are worth another try with the same
/// key. A 409 without `Retry-After` is a business answer ("out of stock"), final like any 4xx.
fn retryable(status: StatusCode, headers: &HeaderMap) -> bool {
    (status == StatusCode::CONFLICT && headers.contains_key(http::header::RETRY_AFTER))
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

fn error_chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// reqwest is built with rustls but without a bundled crypto provider (ring, as in the rest of
/// the workspace); one must be the process default before a client is built.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
