//! The receiving half for webhooks: [`SignedWebhook`] verifies a Standard Webhooks request
//! (`webhook-id`, `webhook-timestamp`, `webhook-signature`) before the handler sees its body,
//! then [`SignedWebhook::receive`] opens the inbox in the handler's transaction, keyed by the
//! `webhook-id`: a redelivery is answered 2xx without running the handler's work again.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRef, FromRequest, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use txoutbox::inbox::{self, Consumer, InboxClaim, Receive};
use txoutbox::standard_webhooks::{
    verify_with, VerifyError, WebhookSecret, TIMESTAMP_TOLERANCE, WEBHOOK_ID, WEBHOOK_SIGNATURE,
    WEBHOOK_TIMESTAMP,
};
use txoutbox::WriteTx;

use crate::Problem;

/// What a webhook endpoint accepts: its consumer (the inbox's name for it), the secrets a
/// sender may sign with, and how far a `webhook-timestamp` may be from the receiver's clock.
///
/// The extractor finds it in the router's state (`WebhookReceiver: FromRef<S>`).
#[derive(Clone)]
pub struct WebhookReceiver {
    consumer: Consumer,
    secrets: Arc<[WebhookSecret]>,
    tolerance: Duration,
}

impl std::fmt::Debug for WebhookReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookReceiver")
            .field("consumer", &self.consumer)
            .field("secrets", &self.secrets.len())
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

impl WebhookReceiver {
    /// An endpoint of `consumer` that accepts what `secret` signed, with a timestamp within 5
    /// minutes of now ([`TIMESTAMP_TOLERANCE`]) either way.
    pub fn new(consumer: Consumer, secret: WebhookSecret) -> Self {
        Self {
            consumer,
            secrets: Arc::from(vec![secret]),
            tolerance: TIMESTAMP_TOLERANCE,
        }
    }

    /// An endpoint of `consumer` that accepts what any of `secrets` (in the `whsec_<base64>`
    /// form) signed: several while a secret is rotated. Fails with [`txoutbox::Error::Config`]
    /// for none, or one that does not parse (the text never shows a secret).
    pub fn from_whsec<'a>(
        consumer: Consumer,
        secrets: impl IntoIterator<Item = &'a str>,
    ) -> txoutbox::Result<Self> {
        let parsed = secrets
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                WebhookSecret::parse(s)
                    .map_err(|e| txoutbox::Error::Config(format!("webhook secret {}: {e}", i + 1)))
            })
            .collect::<txoutbox::Result<Vec<_>>>()?;
        if parsed.is_empty() {
            return Err(txoutbox::Error::Config(
                "a webhook receiver needs at least one secret".into(),
            ));
        }
        Ok(Self {
            consumer,
            secrets: Arc::from(parsed),
            tolerance: TIMESTAMP_TOLERANCE,
        })
    }

    /// Also accepts what `secret` signed (the new secret of a rotation, or the old one).
    pub fn with_secret(mut self, secret: WebhookSecret) -> Self {
        let mut secrets = self.secrets.to_vec();
        secrets.push(secret);
        self.secrets = Arc::from(secrets);
        self
    }

    /// How far a `webhook-timestamp` may be from now, either way (5 minutes by default). A
    /// longer tolerance lets a captured request be replayed for longer; the inbox still answers
    /// its replay as a duplicate within the consumer's window.
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The consumer whose inbox records the endpoint's messages.
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }
}

/// A webhook request whose signature and timestamp verified: its `webhook-id`, its timestamp and
/// its body, read once.
///
/// Rejections ([`WebhookRejection`], each a problem document): a missing or unreadable
/// `webhook-*` header, a timestamp that is not unix seconds or an id that is no message id
/// (over 255 bytes) are 400; a body over the route's limit (axum's `DefaultBodyLimit`, 2 MB by
/// default) is 413; a timestamp outside the tolerance, or no signature matching any secret,
/// is 401. Nothing of the body reaches the handler before it verified.
#[derive(Debug, Clone)]
pub struct SignedWebhook {
    id: String,
    timestamp: i64,
    body: Bytes,
    consumer: Consumer,
}

/// The outcome of [`SignedWebhook::receive`].
#[derive(Debug)]
// Matched once per request, at once.
#[allow(clippy::large_enum_variant)]
pub enum Received {
    /// The first delivery of this `webhook-id`: apply it, enqueue its onward effects on the
    /// claim, [`InboxClaim::complete`], commit, answer 2xx.
    New(InboxClaim),
    /// Applied before: return this answer (200, `{"duplicate": true, "first_received": …}`) so
    /// the sender stops retrying, and let the transaction drop.
    Duplicate(Response),
}

/// Why [`SignedWebhook`] refused a request.
#[derive(Debug)]
#[non_exhaustive]
pub enum WebhookRejection {
    /// A `webhook-*` header is missing or unreadable, or its value is malformed (400).
    BadHeaders(String),
    /// The body could not be read (413 over the limit).
    Body(BytesRejection),
    /// The signature or the timestamp did not verify (401).
    Unauthorized(VerifyError),
}

impl WebhookRejection {
    /// The problem document it answers with.
    pub fn problem(&self) -> Problem {
        match self {
            Self::BadHeaders(detail) => Problem::webhook_headers(detail.clone()),
            Self::Body(rejection) => crate::problem::unreadable_body(rejection),
            Self::Unauthorized(e @ VerifyError::InvalidSignature) => {
                Problem::webhook_signature(e.to_string())
            }
            Self::Unauthorized(e) => Problem::webhook_timestamp(e.to_string()),
        }
    }
}

impl std::fmt::Display for WebhookRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.problem().fmt(f)
    }
}

impl std::error::Error for WebhookRejection {}

answers_as_problem!(WebhookRejection);

/// The three `webhook-*` headers, as text.
fn webhook_headers(headers: &HeaderMap) -> Result<[String; 3], WebhookRejection> {
    let read = |name: &'static str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| {
                WebhookRejection::BadHeaders(format!("missing or unreadable header {name}"))
            })
    };
    let id = read(WEBHOOK_ID)?;
    if id.is_empty() || id.len() > 255 {
        return Err(WebhookRejection::BadHeaders(format!(
            "{WEBHOOK_ID} must be 1 to 255 characters long"
        )));
    }
    Ok([id, read(WEBHOOK_TIMESTAMP)?, read(WEBHOOK_SIGNATURE)?])
}

impl<S> FromRequest<S> for SignedWebhook
where
    WebhookReceiver: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = WebhookRejection;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let receiver = WebhookReceiver::from_ref(state);
        let [id, timestamp, signature] = webhook_headers(request.headers())?;
        let body = Bytes::from_request(request, state)
            .await
            .map_err(WebhookRejection::Body)?;
        let header = |name: &'static str| match name {
            WEBHOOK_ID => Some(id.as_str()),
            WEBHOOK_TIMESTAMP => Some(timestamp.as_str()),
            WEBHOOK_SIGNATURE => Some(signature.as_str()),
            _ => None,
        };
        match verify_with(
            &receiver.secrets,
            header,
            &body,
            SystemTime::now(),
            receiver.tolerance,
        ) {
            Ok(()) => {}
            Err(VerifyError::InvalidTimestamp) => {
                return Err(WebhookRejection::BadHeaders(format!(
                    "{WEBHOOK_TIMESTAMP} is not unix seconds"
                )))
            }
            Err(VerifyError::MissingHeader(name)) => {
                return Err(WebhookRejection::BadHeaders(format!(
                    "missing or unreadable header {name}"
                )))
            }
            Err(e) => return Err(WebhookRejection::Unauthorized(e)),
        }
        let timestamp = timestamp.trim().parse().unwrap_or_default();
        Ok(Self {
            id,
            timestamp,
            body,
            consumer: receiver.consumer.clone(),
        })
    }
}

impl SignedWebhook {
    /// The `webhook-id`: the sender's message id, the same on every retry of one message.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The `webhook-timestamp` (unix seconds of this attempt).
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// The body as received (and verified).
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body parsed as JSON; a body that does not parse is a 400 problem.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Problem> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// Records the message in the consumer's inbox inside `tx` ([`inbox::receive`]): the first
    /// delivery gets [`Received::New`], a redelivery [`Received::Duplicate`] with its 2xx answer.
    /// A concurrent delivery of the same id still running past the consumer's lock timeout is a
    /// 409 problem (the sender retries and then gets the duplicate's answer); an unreachable
    /// store 503.
    ///
    /// `tx` is the handler's transaction on any driver txoutbox speaks ([`WriteTx`]): `&tx` of a
    /// deadpool or tokio-postgres transaction, `&mut tx` of a `sqlx::Transaction<'_, Postgres>`
    /// (the `sqlx` feature); the claim's [`InboxClaim::complete`] takes the same.
    pub async fn receive(&self, tx: impl WriteTx) -> Result<Received, Problem> {
        match inbox::receive(tx, &self.consumer, &self.id).await? {
            Receive::New(claim) => Ok(Received::New(claim)),
            Receive::Duplicate { first_received, .. } => {
                let body = serde_json::json!({
                    "duplicate": true,
                    "first_received": first_received.to_rfc3339(),
                });
                Ok(Received::Duplicate(
                    (StatusCode::OK, axum::Json(body)).into_response(),
                ))
            }
        }
    }
}
