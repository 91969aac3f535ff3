//! RFC 9457 problem details: the one shape every error of the integration answers with.

use std::sync::OnceLock;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use txoutbox::sink::error_chain;

/// The media type of a problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer: `{"type","title","status","detail"}` as `application/problem+json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// The `type`: a URI naming the kind of problem, which resolves to its documentation
    /// ([`problem_type`]), or `about:blank` for a problem that says no more than its status.
    pub kind: String,
    /// A short, fixed summary of the kind (the status phrase for `about:blank`).
    pub title: String,
    /// What happened this time, fit to show the client (never a driver's or server's text).
    pub detail: String,
    /// `Retry-After` in seconds, sent with 409 and 503.
    pub retry_after: Option<u64>,
}

/// The `Retry-After` (seconds) of a 503 for an unavailable store, also said in its detail.
pub const UNAVAILABLE_RETRY_AFTER: u64 = 1;

static PROBLEM_BASE: OnceLock<String> = OnceLock::new();

/// Gives each of txoutbox's problems a `type` of its own, documented by the service: each
/// `type` is `base` followed by the problem's name (`problem-mismatch`, `problem-in-flight`,
/// …; the problem types section of the docs lists them), with a precise title ("Idempotency-Key
/// reused"). Call it once at start, before serving. Without it, every problem is RFC 9457's
/// `about:blank`, titled with its status phrase, its `detail` saying what happened: no `type`
/// points to a page that does not exist.
///
/// Fails with [`txoutbox::Error::Config`] for a base that is not an absolute URI
/// (`scheme:...`), or when a different base was set already.
pub fn set_problem_base(base: impl Into<String>) -> txoutbox::Result<()> {
    let base = base.into();
    let scheme = base.split_once(':').map(|(scheme, _)| scheme);
    let absolute = scheme.is_some_and(|s| {
        s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    if !absolute || base.chars().any(|c| !c.is_ascii_graphic()) {
        return Err(txoutbox::Error::Config(format!(
            "problem type base {base:?} is not an absolute URI (https://...)"
        )));
    }
    let stored = PROBLEM_BASE.get_or_init(|| base.clone());
    if *stored != base {
        return Err(txoutbox::Error::Config(format!(
            "problem type base is already {stored:?}; it is set once, at start"
        )));
    }
    Ok(())
}

/// The `type` URI of txoutbox's problem named `name`: the base [`set_problem_base`] set
/// followed by the name, or `about:blank` when no base was set.
pub fn problem_type(name: &str) -> String {
    match PROBLEM_BASE.get() {
        Some(base) => format!("{base}{name}"),
        None => "about:blank".to_owned(),
    }
}

/// The reason phrase RFC 9110 §15 gives `status` (the `title` of an `about:blank` problem,
/// RFC 9457 §4.2.1): "Content Too Large" for 413 and "Unprocessable Content" for 422, where
/// older RFCs (and the `http` crate) say "Payload Too Large" and "Unprocessable Entity".
pub fn status_title(status: StatusCode) -> &'static str {
    match status.as_u16() {
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
        422 => "Unprocessable Content",
        _ => status.canonical_reason().unwrap_or("Unknown Status"),
    }
}

impl Problem {
    /// A problem with `status`, a type URI, a title and a detail.
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

    /// A problem of type `about:blank`: no more meaning than its status, whose RFC 9110 reason
    /// phrase is its title.
    pub fn blank(status: StatusCode, detail: impl Into<String>) -> Self {
        Self::new(status, "about:blank", status_title(status), detail)
    }

    /// One of txoutbox's own problems: of type `name` with its `title` once the service set a
    /// base ([`set_problem_base`]), else `about:blank` titled with the status phrase.
    fn typed(status: StatusCode, name: &str, title: &str, detail: impl Into<String>) -> Self {
        match PROBLEM_BASE.get() {
            Some(base) => Self::new(status, format!("{base}{name}"), title, detail),
            None => Self::blank(status, detail),
        }
    }

    /// Adds `Retry-After: seconds`.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// 400: the request needs an `Idempotency-Key` header and has none.
    pub fn missing_key() -> Self {
        Self::typed(
            StatusCode::BAD_REQUEST,
            "problem-missing-key",
            "Idempotency-Key required",
            "send an Idempotency-Key header (a UUID as an sf-string, \"8e03978e-40d5-43e8-bc93-6894a57f9324\", the same one on every retry of this operation)",
        )
    }

    /// 400: the `Idempotency-Key` header is not a usable key.
    pub fn malformed_key(detail: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::BAD_REQUEST,
            "problem-malformed-key",
            "Malformed Idempotency-Key",
            detail,
        )
    }

    /// 400: the request carries two `Idempotency-Key` fields, or a list of keys in one.
    pub fn multiple_keys() -> Self {
        Self::typed(
            StatusCode::BAD_REQUEST,
            "problem-multiple-keys",
            "More than one Idempotency-Key",
            "send exactly one Idempotency-Key field with one key",
        )
    }

    /// 400: the key is shorter than the scope accepts (too easy to guess or to collide).
    pub fn key_too_short(detail: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::BAD_REQUEST,
            "problem-key-too-short",
            "Idempotency-Key too short",
            detail,
        )
    }

    /// 422: the key was used for a different request.
    pub fn mismatch() -> Self {
        Self::typed(
            StatusCode::UNPROCESSABLE_ENTITY,
            "problem-mismatch",
            "Idempotency-Key reused",
            "this key was already used for a different request; use a new key for a new operation",
        )
    }

    /// 409: another request with this key is running.
    pub fn in_flight() -> Self {
        Self::typed(
            StatusCode::CONFLICT,
            "problem-in-flight",
            "Request in progress",
            "a request with this Idempotency-Key is still being processed; retry shortly with the same key",
        )
        .with_retry_after(1)
    }

    /// 409: the transaction lost a race with a concurrent one (serialization failure, deadlock)
    /// and was rolled back.
    pub fn conflict() -> Self {
        Self::typed(
            StatusCode::CONFLICT,
            "problem-conflict",
            "Concurrent request conflict",
            "the request conflicted with a concurrent one and was rolled back; retry shortly with the same key",
        )
        .with_retry_after(1)
    }

    /// 413: the request body is over the size limit.
    pub fn body_too_large(detail: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::PAYLOAD_TOO_LARGE,
            "problem-body-too-large",
            "Request body too large",
            detail,
        )
    }

    /// 400: a Standard Webhooks request lacks a `webhook-*` header, or one is malformed.
    pub fn webhook_headers(detail: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::BAD_REQUEST,
            "problem-webhook-headers",
            "Standard Webhooks headers missing or malformed",
            detail,
        )
    }

    /// 401: no `webhook-signature` matches any of the endpoint's secrets.
    pub fn webhook_signature(detail: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::UNAUTHORIZED,
            "problem-webhook-signature",
            "Invalid webhook signature",
            detail,
        )
    }

    /// 401: the `webhook-timestamp` is further from the receiver's clock than the tolerance.
    pub fn webhook_timestamp(detail: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::UNAUTHORIZED,
            "problem-webhook-timestamp",
            "Webhook timestamp outside the tolerance",
            detail,
        )
    }

    /// 400: the request body could not be read or parsed.
    pub fn invalid_body(detail: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::BAD_REQUEST,
            "problem-invalid-body",
            "Invalid request body",
            detail,
        )
    }

    /// 422: an effect's payload cannot be delivered as built (an email address that does not
    /// parse, a webhook URL that is not http(s)), refused before anything was written. The
    /// detail is the payload builder's own message.
    pub fn invalid_payload(detail: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::UNPROCESSABLE_ENTITY,
            "problem-invalid-payload",
            "Invalid effect payload",
            detail,
        )
    }

    /// 503: the store could not be reached; nothing was decided. The detail says when to retry
    /// ([`UNAVAILABLE_RETRY_AFTER`], also the `Retry-After`) and nothing of why: the reason is
    /// for the service's log.
    pub fn unavailable() -> Self {
        Self::typed(
            StatusCode::SERVICE_UNAVAILABLE,
            "problem-unavailable",
            "Store unavailable",
            format!("the store is unavailable; retry after {UNAVAILABLE_RETRY_AFTER} s"),
        )
        .with_retry_after(UNAVAILABLE_RETRY_AFTER)
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
        // hyper writes the `http` crate's phrases ("Unprocessable Entity"); RFC 9110 renamed
        // these.
        let renamed: Option<&'static [u8]> = match self.status.as_u16() {
            413 => Some(b"Content Too Large"),
            416 => Some(b"Range Not Satisfiable"),
            422 => Some(b"Unprocessable Content"),
            _ => None,
        };
        if let Some(phrase) = renamed {
            response
                .extensions_mut()
                .insert(hyper::ext::ReasonPhrase::from_static(phrase));
        }
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A server-side failure's text is for the log, never for the client: a 503 says the store is
/// unavailable and when to retry, any other 5xx that the request was rolled back.
/// A body the extractor could not read: 413 over the size limit, else an invalid body answered
/// with axum's own status.
pub(crate) fn unreadable_body(rejection: &axum::extract::rejection::BytesRejection) -> Problem {
    let status = rejection.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return Problem::body_too_large(rejection.body_text());
    }
    let mut problem = Problem::invalid_body(rejection.body_text());
    problem.status = status;
    problem
}

impl From<txoutbox::Error> for Problem {
    fn from(err: txoutbox::Error) -> Self {
        if err.is_unavailable() {
            tracing::error!(error = %error_chain(&err), "the store is unavailable; answered 503");
            return Problem::unavailable();
        }
        match &err {
            txoutbox::Error::Key(key) => return key.into(),
            txoutbox::Error::Conflict { .. } => return Problem::conflict(),
            txoutbox::Error::InvalidPayload(source) => {
                return Problem::invalid_payload(source.to_string())
            }
            _ => {}
        }
        let status =
            StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(error = %error_chain(&err), "request failed");
            return Problem::blank(
                status,
                "the request failed and was rolled back; it is safe to retry with the same key",
            );
        }
        Problem::blank(status, err.to_string())
    }
}

impl From<&txoutbox::idempotency::KeyError> for Problem {
    fn from(err: &txoutbox::idempotency::KeyError) -> Self {
        match err {
            txoutbox::idempotency::KeyError::Missing => Problem::missing_key(),
            txoutbox::idempotency::KeyError::Multiple => Problem::multiple_keys(),
            txoutbox::idempotency::KeyError::TooShort { .. } => {
                Problem::key_too_short(err.to_string())
            }
            _ => Problem::malformed_key(err.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for Problem {
    fn from(err: tokio_postgres::Error) -> Self {
        txoutbox::Error::from(err).into()
    }
}

/// A sqlx error in a handler (its business statements, its pool, its commit): 503 when Postgres
/// cannot be reached, 409 for a serialization failure, else 500, as for tokio-postgres.
#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for Problem {
    fn from(err: sqlx::Error) -> Self {
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
        Problem::invalid_body(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serialization_failure_is_a_409_conflict_with_retry_after() {
        let problem = Problem::from(txoutbox::Error::Conflict {
            message: "could not serialize access due to concurrent update".into(),
            source: None,
        });
        assert_eq!(problem.status, StatusCode::CONFLICT);
        assert_eq!(problem.kind, problem_type("problem-conflict"));
        assert_eq!(problem.retry_after, Some(1));
        // The server's message is for the log, not for the client.
        assert!(!problem.detail.contains("serialize"));
    }

    #[test]
    fn an_invalid_payload_is_a_422_problem_with_the_builders_message() {
        let problem = Problem::from(txoutbox::Error::invalid_payload(std::io::Error::other(
            "invalid to address \"bob@\": Invalid email domain",
        )));
        assert_eq!(problem.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(problem.kind, problem_type("problem-invalid-payload"));
        assert_eq!(
            problem.detail,
            "invalid to address \"bob@\": Invalid email domain"
        );
    }

    #[test]
    fn a_short_key_is_its_own_400_problem() {
        let problem = Problem::from(txoutbox::Error::Key(
            txoutbox::idempotency::KeyError::TooShort { len: 8, min: 16 },
        ));
        assert_eq!(problem.status, StatusCode::BAD_REQUEST);
        assert_eq!(problem.kind, problem_type("problem-key-too-short"));
        assert!(problem.detail.contains("16"), "{}", problem.detail);
    }

    #[test]
    fn without_a_base_a_problem_is_about_blank_titled_with_its_status_phrase() {
        for problem in [
            Problem::mismatch(),
            Problem::in_flight(),
            Problem::missing_key(),
            Problem::unavailable(),
        ] {
            assert_eq!(problem.kind, "about:blank", "{problem}");
            assert_eq!(problem.title, status_title(problem.status), "{problem}");
            assert!(!problem.kind.contains("example.invalid"), "{problem}");
        }
    }

    #[test]
    fn a_503_says_the_store_is_unavailable_and_when_to_retry_and_no_driver_text() {
        let problem = Problem::from(txoutbox::Error::StoreUnavailable {
            message: "cannot connect to 127.0.0.1:5432: Connection refused (os error 111)".into(),
            source: None,
        });
        assert_eq!(problem.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(problem.detail, "the store is unavailable; retry after 1 s");
        assert_eq!(problem.retry_after, Some(UNAVAILABLE_RETRY_AFTER));
    }
}
