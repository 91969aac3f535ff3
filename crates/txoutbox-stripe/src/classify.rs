//! What a failed Stripe call means for the relay: retry with the same key, or dead-letter.
//!
//! Every request carries the row's downstream key as `Idempotency-Key`, so repeating a request
//! whose outcome is unknown (a timeout, a dropped connection, a 5xx) is safe: Stripe answers the
//! first result again instead of charging twice. What cannot succeed by repeating it (a declined
//! card, a bad parameter, a wrong key) is permanent.

use std::time::Duration;

use txoutbox::sink::DeliveryError;

/// Why a Stripe call did not return an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StripeFailure {
    /// Stripe (or something in front of it) answered with an error status.
    #[error("{0}")]
    Api(ApiError),
    /// No answer within the timeout; Stripe may or may not have run the request.
    #[error("no answer from Stripe within {0:?}")]
    Timeout(Duration),
    /// The request did not complete: connection refused or reset, DNS, TLS.
    #[error("could not reach Stripe: {0}")]
    Transport(String),
    /// Stripe answered with success, but the body is not the object expected.
    #[error("Stripe answered with an unreadable body: {0}")]
    Response(String),
    /// The request could not be built (a key Stripe would refuse); nothing was sent.
    #[error("the request was not sent: {0}")]
    Request(String),
}

/// An error answer, with Stripe's `{"error": {...}}` fields when the body has them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP {status}: {}", self.summary())]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// `error.type`: `card_error`, `invalid_request_error`, `idempotency_error`, `api_error`.
    pub error_type: Option<String>,
    /// `error.code`: `card_declined`, `idempotency_key_in_use`, `resource_missing`, ...
    pub code: Option<String>,
    /// `error.decline_code` of a card error: `generic_decline`, `insufficient_funds`, ...
    pub decline_code: Option<String>,
    /// `error.message`, or the start of a body that is not Stripe's JSON.
    pub message: String,
    /// `error.param`: the parameter at fault, if any.
    pub param: Option<String>,
    /// The `Retry-After` header, if the answer had one.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// `code: message` (or `type: message` when there is no code), as recorded in `last_error`.
    pub fn summary(&self) -> String {
        let label = self
            .code
            .as_deref()
            .or(self.error_type.as_deref())
            .unwrap_or("error");
        let mut text = format!("{label}: {}", self.message);
        if let Some(decline) = &self.decline_code {
            text.push_str(&format!(" (decline_code: {decline})"));
        }
        if let Some(param) = &self.param {
            text.push_str(&format!(" (param: {param})"));
        }
        text
    }

    /// Reads Stripe's error body; a body that is not Stripe's JSON (a proxy's HTML page) keeps
    /// its first 200 characters as the message.
    pub fn from_body(status: u16, body: &[u8], retry_after: Option<Duration>) -> Self {
        #[derive(serde::Deserialize)]
        struct Envelope {
            error: Fields,
        }
        #[derive(serde::Deserialize)]
        struct Fields {
            #[serde(rename = "type")]
            error_type: Option<String>,
            code: Option<String>,
            decline_code: Option<String>,
            message: Option<String>,
            param: Option<String>,
        }
        match serde_json::from_slice::<Envelope>(body) {
            Ok(Envelope { error }) => Self {
                status,
                error_type: error.error_type,
                code: error.code,
                decline_code: error.decline_code,
                message: error
                    .message
                    .unwrap_or_else(|| "(Stripe gave no message)".to_owned()),
                param: error.param,
                retry_after,
            },
            Err(_) => Self {
                status,
                error_type: None,
                code: None,
                decline_code: None,
                message: String::from_utf8_lossy(body).chars().take(200).collect(),
                param: None,
                retry_after,
            },
        }
    }
}

/// Turns a failed call into what the relay should do.
///
/// - 409 (`idempotency_key_in_use`: the first attempt with this key is still running), 429 and
///   5xx are retryable, after `Retry-After` when Stripe gave one;
/// - 400 `idempotency_error` is permanent: Stripe saw this key before with other parameters
///   (the row's payload or the sink's request changed since the first attempt, or another
///   request used the key), and will refuse every retry the same way;
/// - every other 4xx is permanent (a declined card, a bad parameter, a wrong API key), with
///   Stripe's code first in the message: `card_declined: Your card was declined.`;
/// - timeouts and transport failures are retryable: the same key makes a repeat safe;
/// - an unreadable success body is retryable (the repeat is answered from Stripe's cache);
/// - a request that could not be built is permanent.
pub fn classify(failure: &StripeFailure) -> DeliveryError {
    match failure {
        StripeFailure::Api(error) => classify_api(error),
        StripeFailure::Timeout(after) => DeliveryError::retryable(format!(
            "no answer from Stripe within {after:?}; retrying with the same Idempotency-Key"
        )),
        StripeFailure::Transport(message) => {
            DeliveryError::retryable(format!("could not reach Stripe: {message}"))
        }
        StripeFailure::Response(message) => DeliveryError::retryable(format!(
            "Stripe answered with an unreadable body ({message}); retrying, the replay is \
             answered from Stripe's idempotency cache"
        )),
        StripeFailure::Request(message) => {
            DeliveryError::permanent(format!("the request was not sent: {message}"))
        }
    }
}

fn classify_api(error: &ApiError) -> DeliveryError {
    let retry = |message: String| match error.retry_after {
        Some(after) => DeliveryError::retry_after(message, after),
        None => DeliveryError::retryable(message),
    };
    match error.status {
        409 => retry(format!(
            "{} (HTTP 409: a request with this Idempotency-Key is still in progress)",
            error.summary()
        )),
        429 => retry(format!("{} (HTTP 429: rate limited)", error.summary())),
        500..=599 => retry(format!("{} (HTTP {})", error.summary(), error.status)),
        400 if error.error_type.as_deref() == Some("idempotency_error") => {
            DeliveryError::permanent(format!(
                "idempotency_error: Stripe already saw this Idempotency-Key with different \
                 parameters, so it refuses this request, now and on every retry (the payload \
                 changed since the first attempt, or another request used the same key). \
                 Stripe said: {} (HTTP 400)",
                error.message
            ))
        }
        400..=499 => {
            DeliveryError::permanent(format!("{} (HTTP {})", error.summary(), error.status))
        }
        status => retry(format!(
            "unexpected HTTP {status} from Stripe: {}",
            error.summary()
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use txoutbox::sink::parse_retry_after;

    use super::*;

    fn api(status: u16, error_type: &str, code: Option<&str>, message: &str) -> StripeFailure {
        StripeFailure::Api(ApiError {
            status,
            error_type: Some(error_type.to_owned()),
            code: code.map(str::to_owned),
            decline_code: None,
            message: message.to_owned(),
            param: None,
            retry_after: None,
        })
    }

    #[test]
    fn a_declined_card_is_permanent_with_stripes_code_first() {
        let mut failure = api(
            402,
            "card_error",
            Some("card_declined"),
            "Your card was declined.",
        );
        if let StripeFailure::Api(e) = &mut failure {
            e.decline_code = Some("insufficient_funds".into());
        }
        let decided = classify(&failure);
        assert!(decided.is_permanent());
        let text = decided.to_string();
        assert!(
            text.starts_with("card_declined: Your card was declined."),
            "{text}"
        );
        assert!(text.contains("insufficient_funds"), "{text}");
    }

    #[test]
    fn other_client_errors_are_permanent() {
        for status in [400, 401, 403, 404] {
            let decided = classify(&api(
                status,
                "invalid_request_error",
                None,
                "Invalid API Key provided: sk_****1234",
            ));
            assert!(decided.is_permanent(), "{status}");
            assert!(decided
                .to_string()
                .starts_with("invalid_request_error: Invalid API Key"));
        }
    }

    #[test]
    fn same_key_with_other_parameters_is_permanent_and_says_why() {
        let decided = classify(&api(
            400,
            "idempotency_error",
            None,
            "Keys for idempotent requests can only be used with the same parameters ...",
        ));
        assert!(decided.is_permanent());
        let text = decided.to_string();
        assert!(text.starts_with("idempotency_error"), "{text}");
        assert!(text.contains("different parameters"), "{text}");
    }

    #[test]
    fn a_key_still_in_use_is_retried() {
        let decided = classify(&api(
            409,
            "idempotency_error",
            Some("idempotency_key_in_use"),
            "There is currently another in-progress request using this Idempotency-Key",
        ));
        assert!(!decided.is_permanent());
        assert!(decided.to_string().starts_with("idempotency_key_in_use"));
    }

    #[test]
    fn rate_limits_and_server_errors_are_retried_after_retry_after() {
        for status in [429, 500, 502, 503, 504] {
            let mut failure = api(status, "api_error", None, "Something went wrong");
            assert!(!classify(&failure).is_permanent(), "{status}");
            if let StripeFailure::Api(e) = &mut failure {
                e.retry_after = Some(Duration::from_secs(7));
            }
            match classify(&failure) {
                DeliveryError::Retryable { retry_after, .. } => {
                    assert_eq!(retry_after, Some(Duration::from_secs(7)), "{status}")
                }
                other => panic!("{status}: {other:?}"),
            }
        }
    }

    #[test]
    fn no_answer_is_retried_with_the_same_key() {
        for failure in [
            StripeFailure::Timeout(Duration::from_secs(20)),
            StripeFailure::Transport("connection refused".into()),
            StripeFailure::Response("missing field `id`".into()),
        ] {
            assert!(!classify(&failure).is_permanent(), "{failure:?}");
        }
        assert!(classify(&StripeFailure::Request("key too long".into())).is_permanent());
    }

    #[test]
    fn a_proxy_error_page_keeps_its_status() {
        let error = ApiError::from_body(502, b"<html>Bad Gateway</html>", None);
        assert_eq!(error.status, 502);
        assert_eq!(error.message, "<html>Bad Gateway</html>");
        assert!(!classify(&StripeFailure::Api(error)).is_permanent());
    }

    #[test]
    fn stripes_error_body_is_read() {
        let body = br#"{"error":{"type":"card_error","code":"card_declined","decline_code":"generic_decline","message":"Your card was declined.","charge":"ch_1"}}"#;
        let error = ApiError::from_body(402, body, None);
        assert_eq!(error.error_type.as_deref(), Some("card_error"));
        assert_eq!(error.code.as_deref(), Some("card_declined"));
        assert_eq!(error.decline_code.as_deref(), Some("generic_decline"));
        assert_eq!(error.message, "Your card was declined.");
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
