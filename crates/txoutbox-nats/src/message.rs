//! The broker message a service enqueues.

use serde::{Deserialize, Serialize};
use txoutbox::OutboxMessage;

/// The destination name of nats rows by default ([`NatsMessage::into_outbox_message`]'s).
pub const DESTINATION: &str = "nats";

/// One message to publish, as stored in the outbox row's payload. The JetStream message's
/// body is `data` as JSON; its headers are the row's headers (`OutboxMessage::with_header`, for
/// trace context) plus `Nats-Msg-Id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NatsMessage {
    /// The subject to publish to; `None` uses the sink's subject ([`crate::NatsSink::with_subject`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The message body, published as JSON.
    pub data: serde_json::Value,
}

impl NatsMessage {
    /// A message carrying `data`, for the sink's subject.
    pub fn new(data: serde_json::Value) -> Self {
        Self {
            subject: None,
            data,
        }
    }

    /// Publishes to `subject` instead of the sink's subject.
    pub fn to_subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// The outbox message for the default destination, `"nats"`.
    pub fn into_outbox_message(self) -> txoutbox::Result<OutboxMessage> {
        self.into_outbox_message_for(DESTINATION)
    }

    /// The outbox message for a named destination (`"nats:orders"`): register a
    /// [`crate::NatsSink`] under that name.
    pub fn into_outbox_message_for(self, destination: &str) -> txoutbox::Result<OutboxMessage> {
        OutboxMessage::new(destination, &self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_goes_to_the_named_destination_and_round_trips() {
        let m = NatsMessage::new(serde_json::json!({"order": 1})).to_subject("orders.paid");
        assert_eq!(
            m.clone()
                .into_outbox_message_for("nats:orders")
                .expect("ok")
                .destination(),
            "nats:orders"
        );
        assert_eq!(
            m.clone().into_outbox_message().expect("ok").destination(),
            "nats"
        );
        let json = serde_json::to_value(&m).expect("json");
        assert_eq!(
            serde_json::from_value::<NatsMessage>(json).expect("back"),
            m
        );
        let bare: NatsMessage = serde_json::from_value(serde_json::json!({"data": 5})).expect("ok");
        assert_eq!(bare.subject, None);
    }
}
