//! The webhook payload a service enqueues, and the body the receiver gets.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use txoutbox::OutboxMessage;

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
    /// [`crate::WebhookSink`] under that name.
    pub fn into_outbox_message_for(self, destination: &str) -> txoutbox::Result<OutboxMessage> {
        OutboxMessage::new(destination, &self)
    }

    /// The request body: minified JSON, deterministic for one row.
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
}
