//! The webhook payload a service enqueues, its checks, and the body the receiver gets.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use txoutbox::OutboxMessage;

/// Why a payload is not a webhook the sink can deliver.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// The JSON is not a [`Webhook`]'s (a missing `event_type` or `data`, a wrong type).
    #[error("not a webhook payload: {0}")]
    NotAWebhook(#[source] serde_json::Error),
    /// The event's own URL does not parse, or is not http(s).
    #[error("invalid webhook URL {url:?}: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A refused webhook is [`txoutbox::Error::InvalidPayload`], this error its source (422 in a
/// handler).
impl From<PayloadError> for txoutbox::Error {
    fn from(err: PayloadError) -> Self {
        txoutbox::Error::invalid_payload(err)
    }
}

/// Checks a raw JSON payload for a webhook destination as the sink will read it: the shape of
/// a [`Webhook`] and its URL, if it names one. For code that enqueues
/// `OutboxMessage::new("webhook:crm", &json)` rather than building a [`Webhook`]:
///
/// ```
/// let payload = serde_json::json!({"event_type": "contact.created", "data": {"id": 7}});
/// txoutbox_webhook::check(&payload)?;
/// let wrong = serde_json::json!({"type": "contact.created", "data": {"id": 7}});
/// assert!(txoutbox_webhook::check(&wrong).is_err()); // the field is event_type
/// # Ok::<(), txoutbox_webhook::PayloadError>(())
/// ```
pub fn check(payload: &serde_json::Value) -> Result<(), PayloadError> {
    Webhook::from_payload(payload).map(|_| ())
}

/// An event's own URL, as the sink sends to it: http or https.
pub(crate) fn parse_url(url: &str) -> Result<url::Url, String> {
    let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
    match parsed.scheme() {
        "http" | "https" => Ok(parsed),
        other => Err(format!("the scheme must be http or https, not {other}")),
    }
}

/// The destination name of webhook rows by default ([`Webhook::into_outbox_message`]'s).
pub const DESTINATION: &str = "webhook";

/// One webhook event, as stored in the outbox row's payload.
///
/// The receiver gets the Standard Webhooks body `{"type": event_type, "timestamp": <when the
/// business transaction enqueued it, RFC 3339>, "data": data}`, the same bytes on every attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Webhook {
    /// Sends to this URL instead of the sink's own (signed with the sink's secret, so use it only
    /// for endpoints that share that secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The event type, full-stop delimited (`invoice.paid`).
    pub event_type: String,
    /// The event data.
    pub data: serde_json::Value,
}

impl Webhook {
    /// An event of `event_type` carrying `data`, for the sink's configured URL.
    pub fn new(event_type: impl Into<String>, data: serde_json::Value) -> Self {
        Self {
            url: None,
            event_type: event_type.into(),
            data,
        }
    }

    /// Sends this event to `url` instead of the sink's configured URL.
    pub fn to_url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The outbox message for the default destination, `"webhook"`.
    pub fn into_outbox_message(self) -> txoutbox::Result<OutboxMessage> {
        self.into_outbox_message_for(DESTINATION)
    }

    /// The outbox message for a named endpoint's destination (`"webhook:orders"`): register a
    /// `WebhookSink` under that name. An event URL that is not http(s) is refused here
    /// ([`txoutbox::Error::InvalidPayload`], a [`PayloadError`] its source), not by the relay.
    pub fn into_outbox_message_for(self, destination: &str) -> txoutbox::Result<OutboxMessage> {
        self.validate()?;
        OutboxMessage::new(destination, &self)
    }

    /// What the sink would refuse in this event, if anything: an event URL that is not http(s).
    pub fn validate(&self) -> Result<(), PayloadError> {
        match &self.url {
            Some(url) => parse_url(url)
                .map(|_| ())
                .map_err(|reason| PayloadError::Url {
                    url: url.clone(),
                    reason,
                }),
            None => Ok(()),
        }
    }

    /// The webhook in an outbox row's payload, checked as [`Webhook::into_outbox_message`]
    /// checks it: what the sink delivers, and what [`check`] accepts.
    pub fn from_payload(payload: &serde_json::Value) -> Result<Self, PayloadError> {
        let hook = Self::deserialize(payload).map_err(PayloadError::NotAWebhook)?;
        hook.validate()?;
        Ok(hook)
    }

    /// The request body: minified JSON, deterministic for one row.
    #[cfg_attr(not(feature = "sink"), allow(dead_code))]
    pub(crate) fn body(&self, occurred_at: DateTime<Utc>) -> Result<Vec<u8>, serde_json::Error> {
        #[derive(Serialize)]
        struct Body<'a> {
            #[serde(rename = "type")]
            event_type: &'a str,
            timestamp: String,
            data: &'a serde_json::Value,
        }
        serde_json::to_vec(&Body {
            event_type: &self.event_type,
            timestamp: occurred_at.to_rfc3339_opts(SecondsFormat::Micros, true),
            data: &self.data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_follows_the_standard_webhooks_payload_shape() {
        let at = DateTime::parse_from_rfc3339("2022-11-03T20:26:10.344522Z")
            .expect("date")
            .with_timezone(&Utc);
        let body = Webhook::new("contact.created", serde_json::json!({"id": "c_1"}))
            .body(at)
            .expect("serialises");
        assert_eq!(
            std::str::from_utf8(&body).expect("utf-8"),
            r#"{"type":"contact.created","timestamp":"2022-11-03T20:26:10.344522Z","data":{"id":"c_1"}}"#
        );
    }

    #[test]
    fn message_goes_to_the_named_destination_and_round_trips() {
        let hook = Webhook::new("order.paid", serde_json::json!({"order": 7})).to_url("http://x/y");
        let message = hook
            .clone()
            .into_outbox_message_for("webhook:orders")
            .expect("message");
        assert_eq!(message.destination(), "webhook:orders");
        assert_eq!(
            hook.clone()
                .into_outbox_message()
                .expect("message")
                .destination(),
            "webhook"
        );
        let json = serde_json::to_value(&hook).expect("json");
        assert_eq!(serde_json::from_value::<Webhook>(json).expect("back"), hook);
    }

    #[test]
    fn check_accepts_a_built_webhook_and_refuses_a_wrong_shape() {
        let built = Webhook::new("contact.created", serde_json::json!({"id": "c_1"}))
            .to_url("https://crm.example/hooks")
            .into_outbox_message_for("webhook:crm")
            .expect("valid");
        check(built.payload()).expect("a built webhook passes the check");
        // The Standard Webhooks body's `type` is not the payload's `event_type`.
        let wrong = serde_json::json!({"type": "contact.created", "data": {"id": "c_1"}});
        let err = check(&wrong).expect_err("refused");
        assert!(matches!(err, PayloadError::NotAWebhook(_)), "{err:?}");
        assert!(err.to_string().contains("event_type"), "{err}");
        let ftp = serde_json::json!({"event_type": "a.b", "data": 1, "url": "ftp://x.example/"});
        assert!(matches!(check(&ftp), Err(PayloadError::Url { .. })));
    }

    #[test]
    fn a_url_the_sink_would_refuse_is_refused_when_built_as_a_422() {
        let err = Webhook::new("a.b", serde_json::json!(null))
            .to_url("not a url")
            .into_outbox_message()
            .expect_err("refused");
        assert_eq!(err.http_status(), 422);
        let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<PayloadError>());
        assert!(matches!(source, Some(PayloadError::Url { .. })), "{err:?}");
    }
}
