//! The payloads' mapping onto async-stripe's typed requests (which do Stripe's form encoding).

use super::{NewPaymentIntent, NewRefund};

/// The metadata pairs as async-stripe takes them.
fn stripe_metadata(
    metadata: &std::collections::BTreeMap<String, String>,
) -> std::collections::HashMap<String, String> {
    metadata.clone().into_iter().collect()
}

impl NewPaymentIntent {
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
            request = request.metadata(stripe_metadata(&self.metadata));
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
    /// async-stripe's request for this payload.
    pub(crate) fn to_stripe(&self) -> stripe_core::refund::CreateRefund {
        let mut request =
            stripe_core::refund::CreateRefund::new().payment_intent(self.payment_intent.as_str());
        if let Some(amount) = self.amount {
            request = request.amount(amount);
        }
        if !self.metadata.is_empty() {
            request = request.metadata(stripe_metadata(&self.metadata));
        }
        request
    }
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

    /// `request` goes to `path`, its body exactly the form fields `fields`, in any order.
    fn assert_form(
        request: &stripe_client_core::RequestBuilder,
        path: &str,
        fields: &[(&str, &str)],
    ) {
        assert_eq!(request.path, path);
        assert_eq!(
            form(request.body.as_deref().expect("test value")),
            pairs(fields)
        );
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
        assert_form(
            &request,
            "/payment_intents",
            &[
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
            ],
        );
    }

    #[test]
    fn refund_is_form_encoded() {
        let request = NewRefund::new("pi_1")
            .with_amount(500)
            .with_metadata("reason", "damaged")
            .to_stripe()
            .build();
        assert_form(
            &request,
            "/refunds",
            &[
                ("amount", "500"),
                ("metadata[reason]", "damaged"),
                ("payment_intent", "pi_1"),
            ],
        );
    }
}
