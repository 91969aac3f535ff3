//! RFC 9457 problem details: the one shape every error of the integration answers with.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The media type of a problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer: `{"type","title","status","detail"}` as `application/problem+json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// A URI naming the kind of problem (`about:blank` or a tag such as `urn:txoutbox:...`).
    pub kind: String,
    /// A short, fixed summary of the kind.
    pub title: String,
    /// What happened this time.
    pub detail: String,
    /// `Retry-After` in seconds, sent with 409 and 503.
    pub retry_after: Option<u64>,
}

impl Problem {
    /// A problem with `status`, a type tag, a title and a detail.
    pub fn new(
        status: StatusCode,
        kind: impl Into<String>,
        title: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind: kind.into(),
            title: title.into(),
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// Adds `Retry-After: seconds`.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// 400: the request needs an `Idempotency-Key` header and has none.
    pub fn missing_key() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "urn:txoutbox:missing-idempotency-key",
            "Idempotency-Key required",
            "send an Idempotency-Key header (a UUID, the same one on every retry of this operation)",
        )
    }

    /// 422: the key was used for a different request.
    pub fn mismatch() -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "urn:txoutbox:idempotency-key-reused",
            "Idempotency-Key reused",
            "this key was already used for a different request; use a new key for a new operation",
        )
    }

    /// 409: another request with this key is running.
    pub fn in_flight() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "urn:txoutbox:request-in-progress",
            "Request in progress",
            "a request with this Idempotency-Key is still being processed; retry shortly with the same key",
        )
        .with_retry_after(1)
    }

    /// 503: the store could not be reached; nothing was decided.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "urn:txoutbox:store-unavailable",
            "Service unavailable",
            detail,
        )
        .with_retry_after(1)
    }

    /// The document as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": self.kind,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        })
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.title,
            self.detail
        )
    }
}

impl std::error::Error for Problem {}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.to_json().to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<txoutbox::Error> for Problem {
    fn from(err: txoutbox::Error) -> Self {
        if err.is_unavailable() {
            return Problem::unavailable(format!("the database is unreachable: {err}"));
        }
        let status =
            StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            // The detail of a database error is for the log, not for the client.
            tracing::error!(error = %err, "request failed");
            return Problem::new(
                status,
                "about:blank",
                "Internal server error",
                "the request failed and was rolled back; it is safe to retry with the same key",
            );
        }
        Problem::new(status, "about:blank", "Bad request", err.to_string())
    }
}

impl From<tokio_postgres::Error> for Problem {
    fn from(err: tokio_postgres::Error) -> Self {
        txoutbox::Error::from(err).into()
    }
}

impl From<deadpool_postgres::PoolError> for Problem {
    fn from(err: deadpool_postgres::PoolError) -> Self {
        txoutbox::Error::from(err).into()
    }
}

impl From<serde_json::Error> for Problem {
    fn from(err: serde_json::Error) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "urn:txoutbox:invalid-body",
            "Invalid request body",
            err.to_string(),
        )
    }
}
