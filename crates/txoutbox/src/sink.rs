//! The sink boundary: what a relay hands a downstream adapter, and what the adapter answers.
//!
//! A sink delivers one message to one downstream (an SMTP server, Stripe, a webhook receiver, a
//! broker) and classifies the outcome: delivered with a receipt, retryable (the effect surely or
//! possibly did not happen and trying again with the same key is safe), or permanent (trying again
//! cannot help: dead-letter it). Sinks forward [`Delivery::downstream_key`] as the downstream's own
//! deduplication handle, so a redelivery after a crash is the same effect, not a second one.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// One delivery attempt of an outbox row, as a sink sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The outbox row's id (UUIDv7).
    pub id: Uuid,
    /// The destination the row was enqueued for (the sink's registered name).
    pub destination: String,
    /// The payload, as enqueued.
    pub payload: serde_json::Value,
    /// Headers given at enqueue (trace context and the like).
    pub headers: BTreeMap<String, String>,
    /// The key to forward downstream: the same on every attempt of this row.
    pub downstream_key: String,
    /// The ordering key, if the row has one.
    pub ordering_key: Option<String>,
    /// 1 for the first attempt, 2 for the second, ...
    pub attempt: u32,
    /// When the business transaction enqueued the row.
    pub created_at: DateTime<Utc>,
}

impl Delivery {
    /// Deserialises the payload into the sink's own message type.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, DeliveryError> {
        serde_json::from_value(self.payload.clone()).map_err(|e| {
            DeliveryError::permanent(format!(
                "the payload is not a valid {} message: {e}",
                self.destination
            ))
        })
    }
}

/// What a downstream said when it accepted a message (a Stripe object id, an SMTP reply, a
/// JetStream sequence). Stored with the delivered row and in the attempt log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Receipt(pub Option<String>);

impl Receipt {
    /// A receipt with the downstream's text.
    pub fn new(text: impl Into<String>) -> Self {
        Self(Some(text.into()))
    }

    /// A delivery without anything to keep.
    pub fn none() -> Self {
        Self(None)
    }
}

/// Why an attempt did not deliver, and what the relay should do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// Try again later with the same key (timeouts, connection errors, 429, 5xx, SMTP 4xx).
    /// `retry_after` overrides the backoff when the downstream said when to come back.
    #[error("{message}")]
    Retryable {
        /// What happened, for the attempt log and the operator.
        message: String,
        /// When to come back, if the downstream said so.
        retry_after: Option<Duration>,
    },
    /// Trying again cannot help (4xx, SMTP 5xx, a declined card): dead-letter at once.
    #[error("{message}")]
    Permanent {
        /// What happened; include the downstream's error code when it has one.
        message: String,
    },
    /// The request left, but no answer came back (a timeout after sending, a connection dropped
    /// before the reply): the effect may or may not have happened. The relay retries it with the
    /// same key for an at-least-once destination (the downstream deduplicates), and moves the row
    /// to `unknown` for an at-most-once destination, for an operator to decide.
    #[error("{message}")]
    Indeterminate {
        /// What happened.
        message: String,
    },
}

impl DeliveryError {
    /// A retryable failure with the relay's own backoff.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::Retryable {
            message: message.into(),
            retry_after: None,
        }
    }

    /// A retryable failure with the downstream's retry-after.
    pub fn retry_after(message: impl Into<String>, after: Duration) -> Self {
        Self::Retryable {
            message: message.into(),
            retry_after: Some(after),
        }
    }

    /// A permanent failure.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::Permanent {
            message: message.into(),
        }
    }

    /// A payload the sink cannot deliver as it is (the wrong JSON shape, an address that does
    /// not parse): permanent, and the text names the builder that makes a valid one
    /// (`"txoutbox_webhook::Webhook"`), since such a row was enqueued as raw JSON, unchecked.
    pub fn malformed_payload(builder: &str, reason: impl std::fmt::Display) -> Self {
        Self::permanent(format!(
            "malformed payload (build it with {builder}): {reason}"
        ))
    }

    /// The request may have reached the downstream, but its outcome is unknown.
    pub fn indeterminate(message: impl Into<String>) -> Self {
        Self::Indeterminate {
            message: message.into(),
        }
    }

    /// True for [`DeliveryError::Permanent`].
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Permanent { .. })
    }
}

/// An error with its causes, `outer: cause: root cause`. Client libraries often say only "error
/// sending request" at the top; the attempt log and the operator need the cause.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A downstream adapter. Register one per destination name with the relay.
///
/// A seam: implement it for a downstream of your own (the crates `txoutbox-email`,
/// `txoutbox-stripe`, `txoutbox-webhook` and `txoutbox-nats` are implementations of it). A new
/// method, if one is ever added, comes with a default, so an implementation keeps compiling.
///
/// For an at-most-once destination, answer `Retryable` only when the effect surely did not
/// happen (the connection was refused, the request never left): the relay retries those.
///
/// A sink of one's own: here the downstream is a ledger in memory that deduplicates by the
/// downstream key, as a real downstream's idempotency key or message id does, so a redelivery
/// after a crash books nothing twice.
///
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::Mutex;
/// use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};
///
/// #[derive(Default)]
/// struct Ledger(Mutex<BTreeMap<String, i64>>);
///
/// #[async_trait::async_trait]
/// impl Sink for Ledger {
///     async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
///         #[derive(serde::Deserialize)]
///         struct Entry { cents: i64 }
///         let entry: Entry = delivery.payload_as()?; // a bad payload is permanent
///         let mut booked = self.0.lock().map_err(|_| DeliveryError::retryable("ledger poisoned"))?;
///         booked.entry(delivery.downstream_key.clone()).or_insert(entry.cents);
///         Ok(Receipt::new(format!("{} entries", booked.len())))
///     }
/// }
///
/// let delivery = Delivery {
///     id: uuid::Uuid::now_v7(),
///     destination: "ledger".into(),
///     payload: serde_json::json!({"cents": 1250}),
///     headers: BTreeMap::new(),
///     downstream_key: "order-42-booking".into(),
///     ordering_key: None,
///     attempt: 1,
///     created_at: chrono::Utc::now(),
/// };
/// let ledger = Ledger::default();
/// futures::executor::block_on(async {
///     ledger.deliver(&delivery).await?;
///     let again = Delivery { attempt: 2, ..delivery.clone() }; // a redelivery: same key
///     assert_eq!(ledger.deliver(&again).await?, Receipt::new("1 entries"));
///     let bad = Delivery { payload: serde_json::json!("?"), ..delivery.clone() };
///     assert!(ledger.deliver(&bad).await.unwrap_err().is_permanent());
///     Ok::<_, DeliveryError>(())
/// })?;
/// # Ok::<_, DeliveryError>(())
/// ```
///
/// Register it with [`RelayBuilder::sink`](crate::relay::RelayBuilder::sink); the crate's
/// `custom_sink` example runs one on a relay.
#[async_trait::async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Delivers one message; the relay bounds how many run at once and catches panics.
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError>;

    /// The longest one call of this sink may take (its own request or SMTP timeout), if it has
    /// one. The relay refuses to start with a lease that is not longer than this, since another
    /// relay would then redeliver the row while this call still runs; and it cuts every call off
    /// at the lease in any case.
    fn timeout(&self) -> Option<Duration> {
        None
    }
}

/// What an attempt came to, as handed to a [`CompletionHook`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// The downstream accepted the message.
    Delivered(Receipt),
    /// The row was dead-lettered (permanent error, or attempts exhausted).
    DeadLettered(String),
}

/// Feeds a delivery's result back into the service's own tables (mark a charge `succeeded` with
/// the Stripe id). The hook runs in the relay's completion transaction: the hook's writes and the
/// row's completion commit together. An error rolls both back; the row is then delivered again
/// after its lease expires (with the same key) and the hook runs again.
///
/// A seam: implement it for a service of your own, and register it with
/// [`RelayBuilder::hook`](crate::relay::RelayBuilder::hook). [`Completion`] is
/// `#[non_exhaustive]`: give a match on it an arm for an outcome a later txoutbox may add.
#[async_trait::async_trait]
pub trait CompletionHook: Send + Sync + 'static {
    /// Called once per completed row of the destinations the hook is registered for.
    async fn completed(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        delivery: &Delivery,
        completion: &Completion,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// Reads an HTTP `Retry-After` value (RFC 9110 §10.2.3): delay-seconds (`"120"`) or an HTTP date
/// (`"Wed, 21 Oct 2015 07:28:00 GMT"`), measured from `now`. A date in the past is zero. Anything
/// else (empty, negative, fractional, a sign, garbage) is `None`: the relay's own backoff then
/// applies. A number of seconds too large for a `Duration` saturates rather than overflowing;
/// the relay caps every delay at its retry policy's cap in any case.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // `1*DIGIT` only: `u64::from_str` would also take a leading `+`.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The rustls crypto provider of every TLS connection the workspace opens itself (ring): the
/// core's Postgres connections and the sinks' HTTP clients, chosen once here rather than taken
/// from the process default, so an application's own choice of a default is left alone.
pub fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<std::sync::Arc<rustls::crypto::CryptoProvider>> =
        std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Installs ring as the process's default rustls provider, unless one is installed already
/// (an application that installed its own keeps it). For clients that take the process default,
/// such as reqwest built without a bundled provider (the workspace's, to use ring rather than
/// compile aws-lc): it needs a default before a client is built.
pub fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another thread installing one is fine: a provider is then installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("error sending request")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_chain_keeps_every_cause() {
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(error_chain(&e), "error sending request: connection refused");
    }

    fn http_date_now() -> std::time::SystemTime {
        // Wed, 21 Oct 2015 07:28:00 GMT
        std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480)
    }

    #[test]
    fn retry_after_reads_delay_seconds_and_http_dates_and_a_past_date_is_now() {
        let now = http_date_now();
        for (value, delay) in [
            ("0", Duration::ZERO),
            ("1", Duration::from_secs(1)),
            (" 120 ", Duration::from_secs(120)),
            ("Wed, 21 Oct 2015 07:28:30 GMT", Duration::from_secs(30)),
            ("Wed, 21 Oct 2015 07:00:00 GMT", Duration::ZERO),
            ("Thu, 01 Jan 1970 00:00:00 GMT", Duration::ZERO),
        ] {
            assert_eq!(parse_retry_after(value, now), Some(delay), "{value:?}");
        }
    }

    #[test]
    fn a_huge_retry_after_saturates_instead_of_overflowing() {
        let now = http_date_now();
        assert_eq!(
            parse_retry_after("10000000000000", now),
            Some(Duration::from_secs(10_000_000_000_000))
        );
        let max = Some(Duration::from_secs(u64::MAX));
        assert_eq!(parse_retry_after("18446744073709551615", now), max);
        assert_eq!(parse_retry_after("18446744073709551616", now), max);
        assert_eq!(parse_retry_after(&"9".repeat(400), now), max);
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now).map(|d| d > Duration::ZERO),
            Some(true)
        );
    }

    #[test]
    fn a_hostile_retry_after_is_ignored() {
        let now = http_date_now();
        for bad in [
            "",
            "   ",
            "-5",
            "-0",
            "+5",
            "1.5",
            "1e3",
            "0x10",
            "soon",
            "5 s",
            "1,000",
            "NaN",
            "inf",
            "\0",
            "Wed, 21 Oct 2015 25:61:00 GMT",
            "Wed, 32 Oct 2015 07:28:00 GMT",
            "Wed, 21 Oct 2015 07:28:00 PST",
            "٣",
            "1\u{0}",
        ] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }
}
