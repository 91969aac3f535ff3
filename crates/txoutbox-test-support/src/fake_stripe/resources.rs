//! The endpoints' bodies: Stripe's parameters decoded and checked, PaymentIntents and Refunds
//! created as Stripe's JSON objects.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::{ApiError, Outcome, Store};

/// Test payment methods that decline, as on Stripe: (payment method, code, decline_code, message).
pub(super) const DECLINING_PAYMENT_METHODS: &[(&str, &str, &str, &str)] = &[
    (
        "pm_card_chargeDeclined",
        "card_declined",
        "generic_decline",
        "Your card was declined.",
    ),
    (
        "pm_card_visa_chargeDeclined",
        "card_declined",
        "generic_decline",
        "Your card was declined.",
    ),
    (
        "pm_card_chargeDeclinedInsufficientFunds",
        "card_declined",
        "insufficient_funds",
        "Your card has insufficient funds.",
    ),
    (
        "pm_card_chargeDeclinedFraudulent",
        "card_declined",
        "fraudulent",
        "Your card was declined.",
    ),
    (
        "pm_card_chargeDeclinedExpiredCard",
        "expired_card",
        "expired_card",
        "Your card has expired.",
    ),
    (
        "pm_card_chargeDeclinedIncorrectCvc",
        "incorrect_cvc",
        "incorrect_cvc",
        "Your card's security code is incorrect.",
    ),
];

pub(super) fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `metadata[k]=v` pairs as a map (Stripe's bracket encoding of a hash).
pub(super) fn metadata(params: &[(String, String)]) -> BTreeMap<String, String> {
    params
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("metadata[")
                .and_then(|rest| rest.strip_suffix(']'))
                .map(|name| (name.to_owned(), v.clone()))
        })
        .collect()
}

pub(super) fn missing(name: &str) -> ApiError {
    ApiError::invalid(
        "parameter_missing",
        format!("Missing required param: {name}."),
    )
    .with_param(name)
}

pub(super) fn required<'a>(
    params: &'a [(String, String)],
    name: &str,
) -> Result<&'a str, ApiError> {
    param(params, name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| missing(name))
}

pub(super) fn integer(params: &[(String, String)], name: &str) -> Result<Option<i64>, ApiError> {
    match param(params, name) {
        None => Ok(None),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            Ok(_) => Err(ApiError::invalid(
                "parameter_invalid_integer",
                format!("This value must be greater than or equal to 1 ({name})."),
            )
            .with_param(name)),
            Err(_) => Err(ApiError::invalid(
                "parameter_invalid_integer",
                format!("Invalid integer: {v}"),
            )
            .with_param(name)),
        },
    }
}

pub(super) fn create_intent(store: &mut Store, params: &[(String, String)]) -> Outcome {
    match intent_from(params) {
        Err(e) => Outcome::rejected(e),
        Ok((mut intent, decline)) => {
            let Some((code, decline_code, message)) = decline else {
                store.intents.push(intent.clone());
                return Outcome::ok(intent);
            };
            let charge = new_id("ch");
            let error = json!({
                "type": "card_error",
                "code": code,
                "decline_code": decline_code,
                "message": message,
                "charge": charge,
                "doc_url": format!("https://stripe.com/docs/error-codes/{code}"),
            });
            intent["last_payment_error"] = error.clone();
            intent["latest_charge"] = json!(charge);
            store.intents.push(intent.clone());
            let mut error = error;
            error["payment_intent"] = intent;
            Outcome {
                status: StatusCode::PAYMENT_REQUIRED,
                body: json!({ "error": error }),
                cache: true,
            }
        }
    }
}

pub(super) type Decline = Option<(&'static str, &'static str, &'static str)>;

pub(super) fn intent_from(params: &[(String, String)]) -> Result<(Value, Decline), ApiError> {
    let amount = integer(params, "amount")?.ok_or_else(|| missing("amount"))?;
    let currency = required(params, "currency")?;
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_lowercase()) {
        return Err(ApiError::invalid(
            "parameter_invalid_string",
            format!("Invalid currency: {currency}. Stripe currencies are three-letter ISO codes in lowercase."),
        )
        .with_param("currency"));
    }
    let customer = param(params, "customer");
    if let Some(c) = customer.filter(|c| !c.starts_with("cus_")) {
        return Err(
            ApiError::invalid("resource_missing", format!("No such customer: '{c}'"))
                .with_param("customer"),
        );
    }
    let payment_method = param(params, "payment_method");
    if let Some(pm) = payment_method.filter(|pm| !pm.starts_with("pm_")) {
        return Err(ApiError::invalid(
            "resource_missing",
            format!("No such PaymentMethod: '{pm}'"),
        )
        .with_param("payment_method"));
    }
    let confirm = confirm_param(params)?;
    let id = new_id("pi");
    let (status, decline) = status_of(confirm, payment_method)?;
    let succeeded = status == "succeeded";
    let intent = json!({
        "id": id,
        "object": "payment_intent",
        "amount": amount,
        "amount_capturable": 0,
        "amount_received": if succeeded { amount } else { 0 },
        "application": null,
        "application_fee_amount": null,
        "automatic_payment_methods": null,
        "canceled_at": null,
        "cancellation_reason": null,
        "capture_method": param(params, "capture_method").unwrap_or("automatic"),
        "client_secret": format!("{id}_secret_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]),
        "confirmation_method": "automatic",
        "created": now(),
        "currency": currency,
        "customer": customer,
        "description": param(params, "description"),
        "last_payment_error": null,
        "latest_charge": if succeeded { json!(new_id("ch")) } else { Value::Null },
        "livemode": false,
        "metadata": metadata(params),
        "next_action": null,
        "on_behalf_of": null,
        "payment_method": payment_method,
        "payment_method_types": ["card"],
        "processing": null,
        "receipt_email": null,
        "review": null,
        "setup_future_usage": null,
        "shipping": null,
        "statement_descriptor": null,
        "statement_descriptor_suffix": null,
        "status": status,
        "transfer_data": null,
        "transfer_group": null,
    });
    Ok((intent, decline))
}

/// The `confirm` parameter: absent is false.
fn confirm_param(params: &[(String, String)]) -> Result<bool, ApiError> {
    match param(params, "confirm") {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::invalid(
            "parameter_invalid_boolean",
            format!("Invalid boolean: {other}"),
        )
        .with_param("confirm")),
    }
}

/// A new intent's status, and the decline of a payment method that declines: confirming
/// needs a payment method, and a declined confirmation leaves the intent waiting for another.
fn status_of(
    confirm: bool,
    payment_method: Option<&str>,
) -> Result<(&'static str, Decline), ApiError> {
    match (confirm, payment_method) {
        (true, None) => Err(ApiError::invalid(
            "payment_intent_unexpected_state",
            "You cannot confirm this PaymentIntent because it's missing a payment method. \
             Specify a payment method (payment_method) when confirming.",
        )
        .with_param("payment_method")),
        (true, Some(pm)) => {
            let decline: Decline = DECLINING_PAYMENT_METHODS
                .iter()
                .find(|(name, ..)| *name == pm)
                .map(|(_, code, decline_code, message)| (*code, *decline_code, *message));
            let status = if decline.is_some() {
                "requires_payment_method"
            } else {
                "succeeded"
            };
            Ok((status, decline))
        }
        (false, Some(_)) => Ok(("requires_confirmation", None)),
        (false, None) => Ok(("requires_payment_method", None)),
    }
}

pub(super) fn refund(store: &mut Store, params: &[(String, String)]) -> Outcome {
    match refund_from(store, params) {
        Ok(refund) => {
            store.refunds.push(refund.clone());
            Outcome::ok(refund)
        }
        Err(e) => Outcome::rejected(e),
    }
}

pub(super) fn refund_from(
    store: &mut Store,
    params: &[(String, String)],
) -> Result<Value, ApiError> {
    if param(params, "charge").is_some() && param(params, "payment_intent").is_none() {
        return Err(ApiError::invalid(
            "parameter_unknown",
            "This fake Stripe API refunds by payment_intent only.",
        )
        .with_param("charge"));
    }
    let intent_id = required(params, "payment_intent")?;
    let intent = store
        .intents
        .iter()
        .find(|i| i["id"] == intent_id)
        .cloned()
        .ok_or_else(|| {
            ApiError::invalid(
                "resource_missing",
                format!("No such payment_intent: '{intent_id}'"),
            )
            .with_param("payment_intent")
        })?;
    if intent["status"] != "succeeded" {
        return Err(ApiError::invalid(
            "charge_not_refundable",
            format!(
                "This PaymentIntent ({intent_id}) does not have a successful charge to refund."
            ),
        )
        .with_param("payment_intent"));
    }
    let received = intent["amount_received"].as_i64().unwrap_or(0);
    let already = store.refunded.get(intent_id).copied().unwrap_or(0);
    let left = received - already;
    if left <= 0 {
        return Err(ApiError::invalid(
            "charge_already_refunded",
            format!(
                "Charge {} has already been refunded.",
                intent["latest_charge"].as_str().unwrap_or("")
            ),
        ));
    }
    let amount = integer(params, "amount")?.unwrap_or(left);
    if amount > left {
        return Err(ApiError::invalid(
            "amount_too_large",
            format!(
                "Refund amount ({amount}) is greater than unrefunded amount on charge ({left})"
            ),
        )
        .with_param("amount"));
    }
    store
        .refunded
        .insert(intent_id.to_owned(), already + amount);
    Ok(json!({
        "id": new_id("re"),
        "object": "refund",
        "amount": amount,
        "balance_transaction": null,
        "charge": intent["latest_charge"].clone(),
        "created": now(),
        "currency": intent["currency"].clone(),
        "destination_details": null,
        "metadata": metadata(params),
        "payment_intent": intent_id,
        "reason": param(params, "reason"),
        "receipt_number": null,
        "source_transfer_reversal": null,
        "status": "succeeded",
        "transfer_reversal": null,
    }))
}

pub(super) fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..24]
    )
}

pub(super) fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
