//! The payloads a service enqueues for the `stripe` destination, and their mapping onto
//! async-stripe's typed requests (which do Stripe's form encoding).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use txoutbox::OutboxMessage;

/// The destination name the sink is registered under, and messages are enqueued for.
pub const DESTINATION: &str = "stripe";

/// Stripe's limits on metadata: keys per object, key length, value length.
const METADATA_KEYS: usize = 50;
const METADATA_KEY_LEN: usize = 40;
const METADATA_VALUE_LEN: usize = 500;

/// One Stripe call, as stored in an outbox row (`{"type": "create_payment_intent", ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
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

    fn validate(&self) -> Result<(), String> {
        if self.amount < 1 {
            return Err(format!(
                "a PaymentIntent's amount must be at least 1, not {}",
                self.amount
            ));
        }
        if self.currency.len() != 3 || !self.currency.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(format!(
                "a currency is a three-letter ISO code, not {:?}",
                self.currency
            ));
        }
        if self.customer.is_none() && self.payment_method.is_none() {
            return Err(
                "a confirmed PaymentIntent needs a customer or a payment method (or both)".into(),
            );
        }
        check_metadata(&self.metadata)
    }

    /// async-stripe's request for this payload.
    pub(crate) fn to_stripe(&self) -> stripe_core::payment_intent::CreatePaymentIntent {
        use stripe_core::payment_intent::{
            CreatePaymentIntentAutomaticPaymentMethods as Automatic,
            CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects as Redirects,
        };
        let currency: stripe_types::Currency = self
            .currency
            .to_ascii_lowercase()
            .parse()
            .unwrap_or_else(|never: std::convert::Infallible| match never {});
        let mut automatic = Automatic::new(true);
        automatic.allow_redirects = Some(Redirects::Never);
        let mut request =
            stripe_core::payment_intent::CreatePaymentIntent::new(self.amount, currency)
                .confirm(true)
                .automatic_payment_methods(automatic);
        if let Some(customer) = &self.customer {
            request = request.customer(customer.as_str());
        }
        if let Some(payment_method) = &self.payment_method {
            request = request.payment_method(payment_method.as_str());
        }
        if !self.metadata.is_empty() {
            request = request.metadata(
                self.metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<std::collections::HashMap<_, _>>(),
            );
        }
        if let Some(description) = &self.description {
            request = request.description(description.as_str());
        }
        if let Some(off_session) = self.off_session {
            request = request.off_session(
                stripe_core::payment_intent::CreatePaymentIntentOffSession::Bool(off_session),
            );
        }
        request
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

    fn validate(&self) -> Result<(), String> {
        if self.payment_intent.trim().is_empty() {
            return Err("a refund needs the PaymentIntent to refund".into());
        }
        if let Some(amount) = self.amount.filter(|a| *a < 1) {
            return Err(format!(
                "a refund's amount must be at least 1, not {amount}"
            ));
        }
        check_metadata(&self.metadata)
    }

    /// async-stripe's request for this payload.
    pub(crate) fn to_stripe(&self) -> stripe_core::refund::CreateRefund {
        let mut request =
            stripe_core::refund::CreateRefund::new().payment_intent(self.payment_intent.as_str());
        if let Some(amount) = self.amount {
            request = request.amount(amount);
        }
        if !self.metadata.is_empty() {
            request = request.metadata(
                self.metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<std::collections::HashMap<_, _>>(),
            );
        }
        request
    }
}

impl StripeRequest {
    /// Checks what Stripe would refuse for certain (so the mistake surfaces in the business
    /// transaction, not as a dead letter), then wraps the request in an [`OutboxMessage`] for
    /// [`DESTINATION`]. Fails with [`txoutbox::Error::Invalid`].
    pub fn into_outbox_message(self) -> txoutbox::Result<OutboxMessage> {
        self.validate().map_err(txoutbox::Error::Invalid)?;
        OutboxMessage::new(DESTINATION, &self)
    }

    /// What Stripe would refuse for certain, if anything.
    pub fn validate(&self) -> Result<(), String> {
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

fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    if metadata.len() > METADATA_KEYS {
        return Err(format!(
            "Stripe keeps at most {METADATA_KEYS} metadata keys, not {}",
            metadata.len()
        ));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.chars().count() > METADATA_KEY_LEN {
            return Err(format!(
                "a metadata key has 1 to {METADATA_KEY_LEN} characters: {key:?}"
            ));
        }
        if key.contains(['[', ']']) {
            return Err(format!("a metadata key cannot contain brackets: {key:?}"));
        }
        if value.chars().count() > METADATA_VALUE_LEN {
            return Err(format!(
                "the metadata value of {key:?} is longer than {METADATA_VALUE_LEN} characters"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stripe_client_core::StripeRequest as _;

    fn form(body: &str) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        pairs.sort();
        pairs
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = expected
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        v.sort();
        v
    }

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
    fn payment_intent_is_form_encoded_confirmed_with_bracketed_metadata() {
        let request = NewPaymentIntent::new(2000, "USD")
            .with_customer("cus_1")
            .with_payment_method("pm_card_visa")
            .with_metadata("order_id", "42 & more")
            .with_description("Order 42")
            .with_off_session(true)
            .to_stripe()
            .build();
        assert_eq!(request.path, "/payment_intents");
        assert_eq!(
            form(request.body.as_deref().expect("test value")),
            pairs(&[
                ("amount", "2000"),
                ("automatic_payment_methods[allow_redirects]", "never"),
                ("automatic_payment_methods[enabled]", "true"),
                ("confirm", "true"),
                ("currency", "usd"),
                ("customer", "cus_1"),
                ("description", "Order 42"),
                ("metadata[order_id]", "42 & more"),
                ("off_session", "true"),
                ("payment_method", "pm_card_visa"),
            ])
        );
    }

    #[test]
    fn refund_is_form_encoded() {
        let request = NewRefund::new("pi_1")
            .with_amount(500)
            .with_metadata("reason", "damaged")
            .to_stripe()
            .build();
        assert_eq!(request.path, "/refunds");
        assert_eq!(
            form(request.body.as_deref().expect("test value")),
            pairs(&[
                ("amount", "500"),
                ("metadata[reason]", "damaged"),
                ("payment_intent", "pi_1"),
            ])
        );
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
    fn messages_go_to_the_stripe_destination() {
        let message = NewRefund::new("pi_1")
            .into_outbox_message()
            .expect("test value");
        assert_eq!(message.destination(), DESTINATION);
    }
}
