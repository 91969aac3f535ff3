//! The broker message a service enqueues, and its checks.

use serde::{Deserialize, Serialize};
use txoutbox::OutboxMessage;

/// Why a payload is not a message the sink can publish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// The JSON is not a [`NatsMessage`]'s (no `data`, a subject that is not a string).
    #[error("not a NATS message payload: {0}")]
    NotANatsMessage(#[source] serde_json::Error),
    /// The subject is not one a message can be published to (empty, an empty token, a
    /// wildcard, white space or a control character).
    #[error("{0:?} is not a NATS subject one can publish to")]
    Subject(String),
}

/// A refused message is [`txoutbox::Error::InvalidPayload`], this error its source (422 in a
/// handler).
impl From<PayloadError> for txoutbox::Error {
    fn from(err: PayloadError) -> Self {
        txoutbox::Error::invalid_payload(err)
    }
}

/// Checks a raw JSON payload for a NATS destination as the sink will read it: the shape of a
/// [`NatsMessage`] and its subject, if it names one. For code that enqueues
/// `OutboxMessage::new("nats", &json)` rather than building a [`NatsMessage`]:
///
/// ```
/// let payload = serde_json::json!({"subject": "orders.paid", "data": {"order": 42}});
/// txoutbox_nats::check(&payload)?;
/// let wrong = serde_json::json!({"subject": "orders.*", "data": {"order": 42}});
/// assert!(txoutbox_nats::check(&wrong).is_err()); // a wildcard cannot be published to
/// # Ok::<(), txoutbox_nats::PayloadError>(())
/// ```
pub fn check(payload: &serde_json::Value) -> Result<(), PayloadError> {
    NatsMessage::from_payload(payload).map(|_| ())
}

/// A subject a message can be published to: dot-separated tokens, none empty or a wildcard,
/// without white space or control characters.
pub(crate) fn check_subject(subject: &str) -> Result<(), PayloadError> {
    let valid = !subject.is_empty()
        && !subject.chars().any(|c| c.is_whitespace() || c.is_control())
        && subject
            .split('.')
            .all(|token| !token.is_empty() && token != "*" && token != ">");
    if valid {
        Ok(())
    } else {
        Err(PayloadError::Subject(subject.to_owned()))
    }
}

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

    /// The outbox message for a named destination (`"nats:orders"`): register a `NatsSink`
    /// under that name. A subject no message can be published to is refused here
    /// ([`txoutbox::Error::InvalidPayload`], a [`PayloadError`] its source), not by the relay.
    pub fn into_outbox_message_for(self, destination: &str) -> txoutbox::Result<OutboxMessage> {
        self.validate()?;
        OutboxMessage::new(destination, &self)
    }

    /// What the sink would refuse in this message, if anything: a subject no message can be
    /// published to.
    pub fn validate(&self) -> Result<(), PayloadError> {
        match &self.subject {
            Some(subject) => check_subject(subject),
            None => Ok(()),
        }
    }

    /// The message in an outbox row's payload, checked as [`NatsMessage::into_outbox_message`]
    /// checks it: what the sink publishes, and what [`check`] accepts.
    pub fn from_payload(payload: &serde_json::Value) -> Result<Self, PayloadError> {
        let message = Self::deserialize(payload).map_err(PayloadError::NotANatsMessage)?;
        message.validate()?;
        Ok(message)
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

    #[test]
    fn check_accepts_a_built_message_and_refuses_a_wrong_shape() {
        let built = NatsMessage::new(serde_json::json!({"order": 1}))
            .to_subject("orders.paid")
            .into_outbox_message()
            .expect("valid");
        check(built.payload()).expect("a built message passes the check");
        let no_data = serde_json::json!({"subject": "orders.paid", "body": {"order": 1}});
        let err = check(&no_data).expect_err("refused");
        assert!(matches!(err, PayloadError::NotANatsMessage(_)), "{err:?}");
        let wildcard = serde_json::json!({"subject": "orders.>", "data": 1});
        assert!(matches!(check(&wildcard), Err(PayloadError::Subject(_))));
    }

    #[test]
    fn subjects_must_be_publishable_and_a_refused_one_is_a_422() {
        assert!(check_subject("orders.paid").is_ok());
        for bad in ["", "orders.*", "orders.>", "a..b", ".a", "a b", "a\tb"] {
            assert!(check_subject(bad).is_err(), "{bad:?}");
        }
        let err = NatsMessage::new(serde_json::json!(1))
            .to_subject("orders.*")
            .into_outbox_message()
            .expect_err("refused");
        assert_eq!(err.http_status(), 422);
    }
}
