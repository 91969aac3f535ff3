//! The sink the relay calls: one outbox row, one Stripe request, the row's downstream key as
//! Stripe's `Idempotency-Key`, the created object's id as the receipt.

use std::time::Duration;

use stripe_client_core::{IdempotencyKey, RequestStrategy, StripeRequest as _};
use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};

use crate::classify::{classify, StripeFailure};
use crate::message::StripeRequest;
use crate::transport::Transport;

/// Stripe's API.
pub const DEFAULT_API_BASE: &str = "https://api.stripe.com";

/// How long one request may take by default; the default lease (30 s) holds it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a [`StripeSink`] could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `STRIPE_SECRET_KEY` is not set (or empty).
    #[error("STRIPE_SECRET_KEY is not set")]
    MissingSecretKey,
    /// The key is not a Stripe secret or restricted key.
    #[error("the Stripe key must be a secret (sk_...) or restricted (rk_...) key: {0}")]
    InvalidSecretKey(String),
    /// The API base is not an http(s) URL.
    #[error("the Stripe API base {url:?} is not usable: {reason}")]
    InvalidApiBase {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("the HTTP client could not be built: {0}")]
    Client(String),
}

/// Delivers [`StripeRequest`] rows to Stripe. Register it for [`crate::DESTINATION`].
///
/// The relay's attempts of one row all carry the row's downstream key as `Idempotency-Key`, so
/// however often a row is delivered (a timeout, a crash between Stripe's answer and the
/// relay's commit), Stripe creates one object and answers the same one again.
#[derive(Debug, Clone)]
pub struct StripeSink {
    transport: Transport,
}

impl StripeSink {
    /// A sink for Stripe's API ([`DEFAULT_API_BASE`]) with `secret_key` (`sk_...` or `rk_...`).
    pub fn new(secret_key: impl Into<String>) -> Result<Self, ConfigError> {
        let secret_key = secret_key.into();
        let shown = || match secret_key.get(..8) {
            Some(prefix) => format!("{prefix}..."),
            None => "(too short)".to_owned(),
        };
        if !(secret_key.starts_with("sk_") || secret_key.starts_with("rk_"))
            || !secret_key.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(ConfigError::InvalidSecretKey(shown()));
        }
        let transport = Transport::new(&secret_key, DEFAULT_API_BASE.to_owned(), DEFAULT_TIMEOUT)
            .map_err(ConfigError::Client)?;
        Ok(Self { transport })
    }

    /// Sends requests to `url` instead of Stripe (a local fake, a proxy): `http://127.0.0.1:1234`.
    pub fn with_api_base(mut self, url: impl AsRef<str>) -> Result<Self, ConfigError> {
        let url = url.as_ref();
        let invalid = |reason: String| ConfigError::InvalidApiBase {
            url: url.to_owned(),
            reason,
        };
        let parsed = reqwest::Url::parse(url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https".into()));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid(
                "a query or fragment has no place in a base URL".into(),
            ));
        }
        self.transport.api_base = url.trim_end_matches('/').to_owned();
        Ok(self)
    }

    /// Bounds each request, connecting and reading the answer included (default
    /// [`DEFAULT_TIMEOUT`]); a timeout is retried with the same key. The sink reports it as its
    /// [`Sink::timeout`]: the relay refuses to start with a lease that cannot hold it.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.transport.timeout = timeout;
        self
    }

    /// Reads `STRIPE_SECRET_KEY` (required) and `STRIPE_API_BASE` (default [`DEFAULT_API_BASE`]).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let key = var("STRIPE_SECRET_KEY")
            .filter(|k| !k.trim().is_empty())
            .ok_or(ConfigError::MissingSecretKey)?;
        let sink = Self::new(key.trim())?;
        match var("STRIPE_API_BASE").filter(|b| !b.trim().is_empty()) {
            Some(base) => sink.with_api_base(base.trim()),
            None => Ok(sink),
        }
    }

    /// Where requests go, without a trailing slash.
    pub fn api_base(&self) -> &str {
        &self.transport.api_base
    }

    /// Sends one request with `key` as its `Idempotency-Key`; returns the created object's id.
    pub async fn send(&self, request: &StripeRequest, key: &str) -> Result<String, StripeFailure> {
        let key = IdempotencyKey::new(key)
            .map_err(|e| StripeFailure::Request(format!("Idempotency-Key: {e}")))?;
        let built = match request {
            StripeRequest::CreatePaymentIntent(intent) => intent.to_stripe().build(),
            StripeRequest::CreateRefund(refund) => refund.to_stripe().build(),
        };
        let object: CreatedObject = built
            .customize()
            .request_strategy(RequestStrategy::Idempotent(key))
            .send(&self.transport)
            .await?;
        if object.object != request.object() {
            return Err(StripeFailure::Response(format!(
                "expected a {} object, got a {} ({})",
                request.object(),
                object.object,
                object.id
            )));
        }
        Ok(object.id)
    }
}

/// The part of a created object the sink keeps. Only `id` and `object` are read, so a field
/// Stripe adds or changes in a later API version cannot turn a charge that happened into a
/// parse failure.
#[derive(Debug, miniserde::Deserialize)]
struct CreatedObject {
    id: String,
    object: String,
}

#[async_trait::async_trait]
impl Sink for StripeSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let request = StripeRequest::from_payload(&delivery.payload).map_err(|e| {
            DeliveryError::malformed_payload(
                "txoutbox_stripe::NewPaymentIntent or txoutbox_stripe::NewRefund",
                e,
            )
        })?;
        match self.send(&request, &delivery.downstream_key).await {
            Ok(id) => {
                tracing::info!(
                    message_id = %delivery.id,
                    attempt = delivery.attempt,
                    object = %id,
                    "Stripe {} created",
                    request.object()
                );
                Ok(Receipt::new(id))
            }
            Err(failure) => {
                let decided = classify(&failure);
                tracing::warn!(
                    message_id = %delivery.id,
                    attempt = delivery.attempt,
                    permanent = decided.is_permanent(),
                    error = %failure,
                    "Stripe request failed"
                );
                Err(decided)
            }
        }
    }

    /// One delivery is one request, bounded by [`StripeSink::with_timeout`].
    fn timeout(&self) -> Option<Duration> {
        Some(self.transport.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_key_is_required_and_the_api_base_defaults_to_stripe() {
        assert_eq!(
            StripeSink::from_vars(|_| None).expect_err("refused"),
            ConfigError::MissingSecretKey
        );
        let sink = StripeSink::from_vars(|name| {
            (name == "STRIPE_SECRET_KEY").then(|| "sk_test_123".to_owned())
        })
        .expect("test value");
        assert_eq!(sink.api_base(), DEFAULT_API_BASE);
        let sink = StripeSink::from_vars(|name| match name {
            "STRIPE_SECRET_KEY" => Some("sk_test_123".into()),
            "STRIPE_API_BASE" => Some("http://127.0.0.1:12111/".into()),
            _ => None,
        })
        .expect("test value");
        assert_eq!(sink.api_base(), "http://127.0.0.1:12111");
    }

    #[test]
    fn a_publishable_key_or_a_bad_base_is_refused_at_start() {
        assert!(matches!(
            StripeSink::new("pk_test_123"),
            Err(ConfigError::InvalidSecretKey(_))
        ));
        assert!(matches!(
            StripeSink::new("sk_test_1 23"),
            Err(ConfigError::InvalidSecretKey(_))
        ));
        let sink = StripeSink::new("sk_test_123").expect("test value");
        assert!(matches!(
            sink.with_api_base("ftp://example.invalid"),
            Err(ConfigError::InvalidApiBase { .. })
        ));
    }

    #[test]
    fn the_secret_key_is_not_printed() {
        let sink = StripeSink::new("sk_test_very_secret").expect("test value");
        assert!(!format!("{sink:?}").contains("very_secret"));
    }
}
