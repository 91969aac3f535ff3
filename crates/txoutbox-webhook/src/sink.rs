//! The HTTP sink: one signed POST per attempt, and the classification of what came back.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use txoutbox::sink::{parse_retry_after, Delivery, DeliveryError, Receipt, Sink};

use crate::message::{parse_url, Webhook};
use crate::signature::{sign, WebhookSecret, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};
use txoutbox::standard_webhooks::unix_seconds;

/// Trace-context headers forwarded from the outbox row to the receiver when present.
const FORWARDED: [&str; 2] = ["traceparent", "tracestate"];
/// How much of an error response's body is read and goes into the attempt log. The rest is
/// never read: a receiver may answer megabytes, or a body without end.
const EXCERPT_BYTES: usize = 512;
/// How much of the receipt header's value is kept.
const RECEIPT_HEADER_CHARS: usize = 200;

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
#[non_exhaustive]
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
/// 429 and 5xx retry, after the response's `Retry-After` (seconds or an HTTP date) when it has
/// one; a connection that could not be made (refused, DNS, TLS handshake) retries, since the
/// request surely never left; a timeout or a connection lost after the request was sent is
/// [`DeliveryError::Indeterminate`] (the receiver may have acted on it: the relay retries it for
/// an at-least-once destination, and leaves it `unknown` for an at-most-once one); 3xx
/// (redirects are not followed, as the spec recommends) and other 4xx are permanent. Error
/// messages carry the status and a cleaned excerpt of the body's first bytes.
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
        txoutbox::sink::ensure_crypto_provider();
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
            Some((name, value)) => {
                let value: String = value.chars().take(RECEIPT_HEADER_CHARS).collect();
                Receipt::new(format!("HTTP {status}; {name}: {value}"))
            }
            None => Receipt::new(format!("HTTP {status}")),
        }
    }
}

#[async_trait::async_trait]
impl Sink for WebhookSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let hook = Webhook::from_payload(&delivery.payload)
            .map_err(|e| DeliveryError::malformed_payload("txoutbox_webhook::Webhook", e))?;
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
        let excerpt = read_excerpt(response).await;
        Err(classify_status(status, retry_after, location, &excerpt))
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.config.timeout)
    }
}

/// Reads at most [`EXCERPT_BYTES`] (and one byte more, to know whether the body goes on) of an
/// error response's body, and makes text of it for the attempt log. The connection is dropped
/// with the rest of the body unread.
async fn read_excerpt(mut response: reqwest::Response) -> String {
    let declared = response.content_length();
    let mut bytes = Vec::with_capacity(EXCERPT_BYTES + 1);
    while bytes.len() <= EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = EXCERPT_BYTES + 1 - bytes.len();
                bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    let more = bytes.len() > EXCERPT_BYTES;
    bytes.truncate(EXCERPT_BYTES);
    excerpt(&bytes, more, declared)
}

/// A downstream's bytes as one line of text: invalid UTF-8 and control characters (NUL
/// included) become U+FFFD, line breaks and tabs spaces; a cut body says how long it was.
fn excerpt(bytes: &[u8], more: bool, declared: Option<u64>) -> String {
    let text: String = String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| match c {
            '\n' | '\r' | '\t' => ' ',
            c if c.is_control() => char::REPLACEMENT_CHARACTER,
            c => c,
        })
        .collect();
    let text = text.trim();
    match (more, declared) {
        (false, _) => text.to_owned(),
        (true, Some(total)) => format!("{text}... ({total} bytes)"),
        (true, None) => format!("{text}... (more than {EXCERPT_BYTES} bytes)"),
    }
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

/// A request that got no response. A connection that could not be made (refused, DNS, the TLS
/// handshake, the connect timeout) retries: nothing was sent. Anything later (the timeout, a
/// connection reset or closed before the answer) is indeterminate: the receiver may have acted
/// on the request. A request that could not be built cannot succeed later.
fn classify_transport(e: &reqwest::Error) -> DeliveryError {
    let cause = txoutbox::sink::error_chain(e);
    if e.is_builder() {
        DeliveryError::permanent(format!("webhook request not sent: {cause}"))
    } else if e.is_connect() {
        DeliveryError::retryable(format!("webhook request not sent, no connection: {cause}"))
    } else {
        DeliveryError::indeterminate(format!(
            "webhook request sent, but no answer (the receiver may have acted on it): {cause}"
        ))
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
            other => panic!("a kind this test does not know: {other:?}"),
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
    fn an_excerpt_is_one_line_of_text_without_control_characters() {
        let body = b"bad\0gateway\xff\xfe\r\nline two\x1b[31m";
        let text = excerpt(body, false, None);
        assert_eq!(
            text,
            "bad\u{fffd}gateway\u{fffd}\u{fffd}  line two\u{fffd}[31m"
        );
        assert_eq!(
            excerpt(b"abc", true, Some(10_485_760)),
            "abc... (10485760 bytes)"
        );
        assert_eq!(
            excerpt(b"abc", true, None),
            format!("abc... (more than {EXCERPT_BYTES} bytes)")
        );
    }

    #[test]
    fn the_sink_reports_its_configured_timeout() {
        let secret = WebhookSecret::from_bytes(b"k".to_vec()).expect("secret");
        let config = WebhookConfig {
            timeout: Duration::from_millis(2500),
            ..WebhookConfig::default()
        };
        let sink = WebhookSink::with_config("http://127.0.0.1:9/hooks", secret.clone(), config)
            .expect("sink");
        assert_eq!(sink.timeout(), Some(Duration::from_millis(2500)));
        let sink = WebhookSink::new("http://127.0.0.1:9/hooks", secret).expect("sink");
        assert_eq!(sink.timeout(), Some(WebhookConfig::default().timeout));
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
