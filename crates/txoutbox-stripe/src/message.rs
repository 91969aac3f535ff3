//! The payloads a service enqueues for the `stripe` destination and their checks; with the
//! `sink` feature, `request` maps them onto async-stripe's typed requests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use txoutbox::OutboxMessage;

#[cfg(feature = "sink")]
mod request;

/// Why a payload is not a Stripe request the sink can send.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// The JSON is not a [`StripeRequest`]'s (no or an unknown `type`, a missing, unknown or
    /// misspelt field, a wrong type).
    #[error("not a Stripe request payload: {0}")]
    NotAStripeRequest(#[source] serde_json::Error),
    /// A request Stripe would refuse for certain (an amount below 1, a currency that is not a
    /// three-letter code, metadata over Stripe's limits).
    #[error("{0}")]
    Refused(String),
}

/// A refused request is [`txoutbox::Error::InvalidPayload`], this error its source (422 in a
/// handler).
impl From<PayloadError> for txoutbox::Error {
    fn from(err: PayloadError) -> Self {
        txoutbox::Error::invalid_payload(err)
    }
}

/// Checks a raw JSON payload for the "stripe" destination as the sink will read it: the shape
/// of a [`StripeRequest`] (`{"type": "create_payment_intent", ...}`, no unknown field) and
/// everything Stripe would refuse for certain. For code that enqueues
/// `OutboxMessage::new("stripe", &json)` rather than building a [`NewPaymentIntent`] or a
/// [`NewRefund`]:
///
/// ```
/// let payload = serde_json::json!({"type": "create_refund", "payment_intent": "pi_1"});
/// txoutbox_stripe::check(&payload)?;
/// let wrong = serde_json::json!({"type": "refund", "payment_intent": "pi_1"});
/// assert!(txoutbox_stripe::check(&wrong).is_err());
/// # Ok::<(), txoutbox_stripe::PayloadError>(())
/// ```
pub fn check(payload: &serde_json::Value) -> Result<(), PayloadError> {
    StripeRequest::from_payload(payload).map(|_| ())
}

/// The destination name the sink is registered under, and messages are enqueued for.
pub const DESTINATION: &str = "stripe";

/// Stripe's limits on metadata: keys per object, key length, value length.
const METADATA_KEYS: usize = 50;
const METADATA_KEY_LEN: usize = 40;
const METADATA_VALUE_LEN: usize = 500;

/// One Stripe call, as stored in an outbox row (`{"type": "create_payment_intent", ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StripeRequest {
    /// `POST /v1/payment_intents` with `confirm=true`: charge now.
    CreatePaymentIntent(NewPaymentIntent),
    /// `POST /v1/refunds`: refund a PaymentIntent, wholly or in part.
    CreateRefund(NewRefund),
}

/// A PaymentIntent to create and confirm in one call.
///
/// The sink sends `confirm=true` and, since a relay has no browser to send a customer back to,
/// `automatic_payment_methods[enabled]=true&automatic_payment_methods[allow_redirects]=never`:
/// Stripe then needs no `return_url` and offers no redirect-based payment method.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewPaymentIntent {
    /// In the currency's smallest unit (cents for `usd`); at least 1.
    pub amount: i64,
    /// A three-letter ISO code, lower case (`usd`, `eur`).
    pub currency: String,
    /// The Stripe customer (`cus_...`) the payment belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer: Option<String>,
    /// The payment method (`pm_...`) to charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<String>,
    /// Key-value pairs stored on the intent (at most 50; keys up to 40 characters, values up
    /// to 500).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Shown to the customer and in the dashboard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `true` when the customer is not in the checkout flow (a saved card charged later):
    /// a card that needs authentication then fails with `authentication_required` instead of
    /// waiting in `requires_action`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_session: Option<bool>,
}

/// A refund of a PaymentIntent's charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRefund {
    /// The PaymentIntent (`pi_...`) to refund.
    pub payment_intent: String,
    /// How much to refund, in the smallest unit; the whole remaining amount when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    /// Key-value pairs stored on the refund.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

impl NewPaymentIntent {
    /// A confirmed PaymentIntent of `amount` (smallest unit) in `currency`; add a customer or a
    /// payment method (or both).
    pub fn new(amount: i64, currency: impl Into<String>) -> Self {
        Self {
            amount,
            currency: currency.into(),
            customer: None,
            payment_method: None,
            metadata: BTreeMap::new(),
            description: None,
            off_session: None,
        }
    }

    /// Sets the customer (`cus_...`).
    pub fn with_customer(mut self, customer: impl Into<String>) -> Self {
        self.customer = Some(customer.into());
        self
    }

    /// Sets the payment method (`pm_...`).
    pub fn with_payment_method(mut self, payment_method: impl Into<String>) -> Self {
        self.payment_method = Some(payment_method.into());
        self
    }

    /// Adds one metadata pair.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Marks the payment as made without the customer present.
    pub fn with_off_session(mut self, off_session: bool) -> Self {
        self.off_session = Some(off_session);
        self
    }

    /// Validates it and wraps it in an [`OutboxMessage`] for [`DESTINATION`].
    pub fn into_outbox_message(self) -> txoutbox::Result<OutboxMessage> {
        StripeRequest::CreatePaymentIntent(self).into_outbox_message()
    }

    fn validate(&self) -> Result<(), PayloadError> {
        if self.amount < 1 {
            return Err(refused(format!(
                "a PaymentIntent's amount must be at least 1, not {}",
                self.amount
            )));
        }
        if self.currency.len() != 3 || !self.currency.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(refused(format!(
                "a currency is a three-letter ISO code, not {:?}",
                self.currency
            )));
        }
        if self.customer.is_none() && self.payment_method.is_none() {
            return Err(refused(
                "a confirmed PaymentIntent needs a customer or a payment method (or both)",
            ));
        }
        check_metadata(&self.metadata)
    }
}

impl NewRefund {
    /// A refund of the whole remaining amount of `payment_intent`.
    pub fn new(payment_intent: impl Into<String>) -> Self {
        Self {
            payment_intent: payment_intent.into(),
            amount: None,
            metadata: BTreeMap::new(),
        }
    }

    /// Refunds only `amount` (smallest unit).
    pub fn with_amount(mut self, amount: i64) -> Self {
        self.amount = Some(amount);
        self
    }

    /// Adds one metadata pair.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Validates it and wraps it in an [`OutboxMessage`] for [`DESTINATION`].
    pub fn into_outbox_message(self) -> txoutbox::Result<OutboxMessage> {
        StripeRequest::CreateRefund(self).into_outbox_message()
    }

    fn validate(&self) -> Result<(), PayloadError> {
        if self.payment_intent.trim().is_empty() {
            return Err(refused("a refund needs the PaymentIntent to refund"));
        }
        if let Some(amount) = self.amount.filter(|a| *a < 1) {
            return Err(refused(format!(
                "a refund's amount must be at least 1, not {amount}"
            )));
        }
        check_metadata(&self.metadata)
    }
}

impl StripeRequest {
    /// Checks what Stripe would refuse for certain (so the mistake surfaces in the business
    /// transaction, not as a dead letter), then wraps the request in an [`OutboxMessage`] for
    /// [`DESTINATION`]. Fails with [`txoutbox::Error::InvalidPayload`], a [`PayloadError`] its
    /// source.
    pub fn into_outbox_message(self) -> txoutbox::Result<OutboxMessage> {
        self.validate()?;
        OutboxMessage::new(DESTINATION, &self)
    }

    /// The request in an outbox row's payload, checked as [`StripeRequest::into_outbox_message`]
    /// checks it: what the sink sends, and what [`check`] accepts.
    pub fn from_payload(payload: &serde_json::Value) -> Result<Self, PayloadError> {
        let request = Self::deserialize(payload).map_err(PayloadError::NotAStripeRequest)?;
        request.validate()?;
        Ok(request)
    }

    /// What Stripe would refuse for certain, if anything.
    pub fn validate(&self) -> Result<(), PayloadError> {
        match self {
            Self::CreatePaymentIntent(intent) => intent.validate(),
            Self::CreateRefund(refund) => refund.validate(),
        }
    }

    /// The Stripe object the call creates (`payment_intent`, `refund`), as in its `object` field.
    pub fn object(&self) -> &'static str {
        match self {
            Self::CreatePaymentIntent(_) => "payment_intent",
            Self::CreateRefund(_) => "refund",
        }
    }
}

impl From<NewPaymentIntent> for StripeRequest {
    fn from(intent: NewPaymentIntent) -> Self {
        Self::CreatePaymentIntent(intent)
    }
}

impl From<NewRefund> for StripeRequest {
    fn from(refund: NewRefund) -> Self {
        Self::CreateRefund(refund)
    }
}

fn refused(reason: impl Into<String>) -> PayloadError {
    PayloadError::Refused(reason.into())
}

fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), PayloadError> {
    if metadata.len() > METADATA_KEYS {
        return Err(refused(format!(
            "Stripe keeps at most {METADATA_KEYS} metadata keys, not {}",
            metadata.len()
        )));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.chars().count() > METADATA_KEY_LEN {
            return Err(refused(format!(
                "a metadata key has 1 to {METADATA_KEY_LEN} characters: {key:?}"
            )));
        }
        if key.contains(['[', ']']) {
            return Err(refused(format!(
                "a metadata key cannot contain brackets: {key:?}"
            )));
        }
        if value.chars().count() > METADATA_VALUE_LEN {
            return Err(refused(format!(
                "the metadata value of {key:?} is longer than {METADATA_VALUE_LEN} characters"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_through_json_with_a_type_tag() {
        let request = StripeRequest::from(
            NewPaymentIntent::new(2000, "usd")
                .with_customer("cus_1")
                .with_metadata("order", "42"),
        );
        let json = serde_json::to_value(&request).expect("test value");
        assert_eq!(
            json,
            serde_json::json!({"type": "create_payment_intent", "amount": 2000, "currency": "usd",
                               "customer": "cus_1", "metadata": {"order": "42"}})
        );
        assert_eq!(
            serde_json::from_value::<StripeRequest>(json).expect("test value"),
            request
        );
    }

    #[test]
    fn a_misspelt_payload_field_is_refused_not_ignored() {
        let json =
            serde_json::json!({"type": "create_refund", "payment_intent": "pi_1", "ammount": 5});
        assert!(serde_json::from_value::<StripeRequest>(json).is_err());
    }

    #[test]
    fn what_stripe_would_refuse_is_refused_at_enqueue() {
        assert!(NewPaymentIntent::new(0, "usd")
            .with_customer("cus_1")
            .into_outbox_message()
            .is_err());
        assert!(NewPaymentIntent::new(100, "dollars")
            .with_customer("cus_1")
            .into_outbox_message()
            .is_err());
        assert!(NewPaymentIntent::new(100, "usd")
            .into_outbox_message()
            .is_err());
        assert!(NewPaymentIntent::new(100, "usd")
            .with_customer("cus_1")
            .with_metadata("k".repeat(41), "v")
            .into_outbox_message()
            .is_err());
        assert!(NewRefund::new("pi_1")
            .with_amount(0)
            .into_outbox_message()
            .is_err());
        assert!(NewRefund::new("").into_outbox_message().is_err());
    }

    #[test]
    fn check_accepts_a_built_request_and_refuses_a_wrong_shape() {
        for built in [
            NewPaymentIntent::new(2000, "usd")
                .with_customer("cus_1")
                .into_outbox_message(),
            NewRefund::new("pi_1").with_amount(5).into_outbox_message(),
        ] {
            let built = built.expect("valid");
            check(built.payload()).expect("a built request passes the check");
        }
        let untagged = serde_json::json!({"amount": 2000, "currency": "usd", "customer": "cus_1"});
        let err = check(&untagged).expect_err("refused");
        assert!(matches!(err, PayloadError::NotAStripeRequest(_)), "{err:?}");
        let misspelt = serde_json::json!({"type": "create_refund", "payment_intent": "pi_1",
                                          "ammount": 5});
        assert!(matches!(
            check(&misspelt),
            Err(PayloadError::NotAStripeRequest(_))
        ));
        let zero = serde_json::json!({"type": "create_payment_intent", "amount": 0,
                                      "currency": "usd", "customer": "cus_1"});
        assert!(matches!(check(&zero), Err(PayloadError::Refused(_))));
    }

    #[test]
    fn a_refused_request_is_a_422_keeping_the_payload_error() {
        let err = NewRefund::new("pi_1")
            .with_amount(0)
            .into_outbox_message()
            .expect_err("refused");
        assert_eq!(err.http_status(), 422);
        let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<PayloadError>());
        assert!(matches!(source, Some(PayloadError::Refused(_))), "{err:?}");
    }

    #[test]
    fn messages_go_to_the_stripe_destination() {
        let message = NewRefund::new("pi_1")
            .into_outbox_message()
            .expect("test value");
        assert_eq!(message.destination(), DESTINATION);
    }
}
