//! The HTTP sink: one signed POST per attempt, and the classification of what came back.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use txoutbox::{Delivery, DeliveryError, Receipt, Sink};

use crate::message::Webhook;
use crate::signature::{
    sign, unix_seconds, WebhookSecret, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP,
};

/// Trace-context headers forwarded from the outbox row to the receiver when present.
const FORWARDED: [&str; 2] = ["traceparent", "tracestate"];
/// How much of an error response's body goes into the attempt log.
const SNIPPET_BYTES: usize = 512;

/// The sink's knobs; see [`WebhookConfig::default`].
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The whole attempt, connect to last response byte (default 10 s). Keep it below the
    /// relay's lease.
    pub timeout: Duration,
    /// Connecting alone (default 5 s).
    pub connect_timeout: Duration,
    /// The `user-agent` header (default `txoutbox-webhook/<version>`).
    pub user_agent: String,
    /// A response header whose value goes into the receipt next to the status (default
    /// `x-request-id`).
    pub receipt_header: Option<String>,
    /// A longer `Retry-After` is cut to this (default 1 h), so one receiver cannot park a row
    /// for days.
    pub max_retry_after: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            user_agent: concat!("txoutbox-webhook/", env!("CARGO_PKG_VERSION")).to_owned(),
            receipt_header: Some("x-request-id".to_owned()),
            max_retry_after: Duration::from_secs(60 * 60),
        }
    }
}

/// Why a sink could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The endpoint URL does not parse, or is not http(s).
    #[error("invalid webhook URL {url:?}: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built (TLS set-up).
    #[error("building the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Delivers [`Webhook`] rows as Standard Webhooks: `POST` of the JSON body with `webhook-id` (the
/// row's downstream key, the same on every attempt), `webhook-timestamp`, `webhook-signature` and
/// `Idempotency-Key`.
///
/// Outcomes: 2xx delivers (the receipt is `HTTP <status>` and the receipt header, if any); 408,
/// 429, 5xx, timeouts and connection errors retry, after the response's `Retry-After` (seconds
/// or an HTTP date) when it has one; 3xx (redirects are not followed, as the spec recommends)
/// and other 4xx are permanent, with the status and the start of the body.
#[derive(Debug, Clone)]
pub struct WebhookSink {
    client: reqwest::Client,
    url: reqwest::Url,
    secret: WebhookSecret,
    config: WebhookConfig,
}

impl WebhookSink {
    /// A sink for the endpoint `url`, signing with `secret`, with the default configuration.
    pub fn new(url: &str, secret: WebhookSecret) -> Result<Self, WebhookError> {
        Self::with_config(url, secret, WebhookConfig::default())
    }

    /// A sink for the endpoint `url`, signing with `secret`.
    pub fn with_config(
        url: &str,
        secret: WebhookSecret,
        config: WebhookConfig,
    ) -> Result<Self, WebhookError> {
        let url = parse_url(url).map_err(|reason| WebhookError::Url {
            url: url.to_owned(),
            reason,
        })?;
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.connect_timeout)
            .user_agent(config.user_agent.clone())
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self {
            client,
            url,
            secret,
            config,
        })
    }

    /// The endpoint rows without a URL of their own go to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    fn headers(
        &self,
        delivery: &Delivery,
        body: &[u8],
        now: SystemTime,
    ) -> Result<HeaderMap, DeliveryError> {
        let id = &delivery.downstream_key;
        if id.contains('.') {
            // The signed content is `{id}.{timestamp}.{body}`: the spec forbids a `.` in the id.
            return Err(DeliveryError::permanent(format!(
                "the downstream key {id:?} contains a '.', which a Standard Webhooks id must not"
            )));
        }
        let timestamp = unix_seconds(now);
        let value = |v: &str| {
            HeaderValue::from_str(v).map_err(|_| {
                DeliveryError::permanent(format!("{v:?} is not a valid HTTP header value"))
            })
        };
        let mut headers = HeaderMap::new();
        headers.insert(WEBHOOK_ID, value(id)?);
        headers.insert(WEBHOOK_TIMESTAMP, value(&timestamp.to_string())?);
        headers.insert(
            WEBHOOK_SIGNATURE,
            value(&sign(&self.secret, id, timestamp, body))?,
        );
        headers.insert("idempotency-key", value(id)?);
        headers.insert(http::header::CONTENT_TYPE, value("application/json")?);
        for name in FORWARDED {
            let given = delivery
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name));
            if let Some((_, v)) = given {
                // A malformed trace header is dropped, not a reason to fail the delivery.
                if let Ok(v) = HeaderValue::from_str(v) {
                    headers.insert(HeaderName::from_static(name), v);
                }
            }
        }
        Ok(headers)
    }

    fn receipt(&self, response: &reqwest::Response) -> Receipt {
        let status = response.status().as_u16();
        let id = self
            .config
            .receipt_header
            .as_deref()
            .and_then(|name| Some((name, response.headers().get(name)?.to_str().ok()?)));
        match id {
            Some((name, value)) => Receipt::new(format!("HTTP {status}; {name}: {value}")),
            None => Receipt::new(format!("HTTP {status}")),
        }
    }
}

#[async_trait::async_trait]
impl Sink for WebhookSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let hook: Webhook = delivery.payload_as()?;
        let url = match &hook.url {
            Some(url) => parse_url(url).map_err(|reason| {
                DeliveryError::permanent(format!("invalid webhook URL {url:?}: {reason}"))
            })?,
            None => self.url.clone(),
        };
        let body = hook
            .body(delivery.created_at)
            .map_err(|e| DeliveryError::permanent(format!("serialising the webhook body: {e}")))?;
        let headers = self.headers(delivery, &body, SystemTime::now())?;
        let response = self
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| classify_transport(&e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(self.receipt(&response));
        }
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()))
            .map(|d| d.min(self.config.max_retry_after));
        let location = response
            .headers()
            .get(http::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let snippet = snippet(response).await;
        Err(classify_status(status, retry_after, location, &snippet))
    }
}

/// Reads the start of an error response's body, for the attempt log.
async fn snippet(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    // Stop at the limit: an error page may be large, and only its start is logged.
    while bytes.len() < SNIPPET_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut end = text.len().min(SNIPPET_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].trim().to_owned()
}

/// Maps a non-2xx status to what the relay should do.
fn classify_status(
    status: StatusCode,
    retry_after: Option<Duration>,
    location: Option<String>,
    snippet: &str,
) -> DeliveryError {
    let mut message = format!("the receiver answered {status}");
    if let Some(location) = location.filter(|_| status.is_redirection()) {
        message.push_str(&format!(
            " (redirect to {location}; update the endpoint URL)"
        ));
    }
    if !snippet.is_empty() {
        message.push_str(": ");
        message.push_str(snippet);
    }
    let retryable = status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error();
    match (retryable, retry_after) {
        (true, Some(after)) => DeliveryError::retry_after(message, after),
        (true, None) => DeliveryError::retryable(message),
        (false, _) => DeliveryError::permanent(message),
    }
}

/// A request that got no response: timeouts and connection failures retry (the receiver
/// deduplicates on `webhook-id` if the request did arrive); a request that could not be built
/// cannot succeed later.
fn classify_transport(e: &reqwest::Error) -> DeliveryError {
    let message = format!("webhook request failed: {}", txoutbox::error_chain(e));
    if e.is_builder() {
        DeliveryError::permanent(message)
    } else {
        DeliveryError::retryable(message)
    }
}

/// `Retry-After` is either delay-seconds or an HTTP date (RFC 9110 §10.2.3). A date in the past
/// means "now".
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn parse_url(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    match parsed.scheme() {
        "http" | "https" => Ok(parsed),
        other => Err(format!("the scheme must be http or https, not {other}")),
    }
}

/// reqwest is built with rustls but without a bundled crypto provider (to use ring, as the
/// rest of the workspace does, rather than compile aws-lc); it needs a process default before a
/// client is built. An application that installed its own keeps it.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another thread installing one is fine: a provider is then installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(e: &DeliveryError) -> (&'static str, Option<Duration>) {
        match e {
            DeliveryError::Retryable { retry_after, .. } => ("retry", *retry_after),
            DeliveryError::Permanent { .. } => ("permanent", None),
            DeliveryError::Indeterminate { .. } => ("indeterminate", None),
        }
    }

    #[test]
    fn statuses_are_classified_as_the_spec_suggests() {
        let c = |code: u16| {
            kind(&classify_status(
                StatusCode::from_u16(code).expect("status"),
                None,
                None,
                "",
            ))
            .0
        };
        for code in [408, 429, 500, 502, 503, 504] {
            assert_eq!(c(code), "retry", "{code}");
        }
        for code in [301, 302, 400, 401, 403, 404, 409, 410, 413, 422] {
            assert_eq!(c(code), "permanent", "{code}");
        }
    }

    #[test]
    fn retry_after_is_kept_and_the_message_names_status_and_body() {
        let e = classify_status(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(Duration::from_secs(3)),
            None,
            "busy",
        );
        assert_eq!(kind(&e), ("retry", Some(Duration::from_secs(3))));
        assert_eq!(
            e.to_string(),
            "the receiver answered 503 Service Unavailable: busy"
        );
        let e = classify_status(
            StatusCode::MOVED_PERMANENTLY,
            None,
            Some("https://new/".into()),
            "",
        );
        assert!(e.to_string().contains("redirect to https://new/"), "{e}");
    }

    #[test]
    fn retry_after_parses_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 2015-10-21 07:28:00 GMT
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    #[test]
    fn urls_must_be_http() {
        let secret = WebhookSecret::from_bytes(b"k".to_vec()).expect("secret");
        assert!(WebhookSink::new("ftp://example.invalid/", secret.clone()).is_err());
        assert!(WebhookSink::new("not a url", secret.clone()).is_err());
        // Building an https-capable client needs a TLS crypto provider: this must not panic.
        let sink = WebhookSink::new("https://example.invalid/hooks", secret).expect("sink");
        assert_eq!(sink.url(), "https://example.invalid/hooks");
    }
}
