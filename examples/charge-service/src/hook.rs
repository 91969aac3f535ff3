//! The relay's feedback into the service: a delivered PaymentIntent marks its charge succeeded
//! with the Stripe id, a dead-lettered one marks it failed. It runs in the relay's completion
//! transaction, so the charge's status and the row's completion commit together.
//!
//! The charge is found by the outbox message's id, stored on the charge at enqueue: the id never
//! changes, while the downstream key does when an operator replays the row with `--new-key`.
//!
//! With the shipping chain on ([`ChargeHook::with_shipping`]), a charge that succeeds also
//! enqueues its `charge.succeeded` webhook for the shipping service, in the same transaction: its
//! `webhook-id` (the downstream key) derives from the charge id, so the shipping service's inbox
//! sees one id for one charge however often the webhook is delivered.

use serde_json::json;
use txoutbox::sink::{Completion, CompletionHook, Delivery};

use crate::queries;

/// The destination of the shipping service's webhooks.
pub const SHIPPING_DESTINATION: &str = "webhook:shipping";

/// The event the shipping service ships on.
pub const CHARGE_SUCCEEDED_EVENT: &str = "charge.succeeded";

/// Marks charges `succeeded`/`failed`; register it for the Stripe destination.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChargeHook {
    shipping: bool,
}

impl ChargeHook {
    /// Also enqueues a succeeded charge's `charge.succeeded` webhook to
    /// [`SHIPPING_DESTINATION`] (register a webhook sink under that name).
    pub fn with_shipping(mut self) -> Self {
        self.shipping = true;
        self
    }
}

/// The `webhook-id` of a charge's `charge.succeeded` webhook: derived from the charge id, the
/// same however often the charge's completion runs (a replayed PaymentIntent included).
pub fn shipping_webhook_id(charge_id: uuid::Uuid) -> txoutbox::Result<String> {
    let key = txoutbox::IdempotencyKey::parse(&charge_id.to_string())?;
    Ok(txoutbox::idempotency::derive_downstream_key(
        "charges",
        &key,
        "shipping_webhook",
    ))
}

/// Enqueues the `charge.succeeded` webhook of a charge in the completion's transaction.
async fn enqueue_shipping(
    tx: &tokio_postgres::Transaction<'_>,
    charge_id: uuid::Uuid,
    email: &str,
) -> txoutbox::Result<()> {
    let webhook = txoutbox_webhook::Webhook::new(
        CHARGE_SUCCEEDED_EVENT,
        json!({"charge_id": charge_id, "email": email}),
    )
    .into_outbox_message_for(SHIPPING_DESTINATION)?
    .with_downstream_key(shipping_webhook_id(charge_id)?);
    txoutbox::enqueue(tx, &[webhook]).await?;
    Ok(())
}

/// A completion whose message belongs to no charge: the hook fails, so the completion rolls
/// back and is tried again, and the operator sees why, rather than a payment nobody records.
#[derive(Debug, thiserror::Error)]
#[error("no charge has PaymentIntent message {message_id} (downstream key {downstream_key})")]
pub struct NoSuchCharge {
    /// The outbox message the completion is for.
    pub message_id: uuid::Uuid,
    /// The key it carried.
    pub downstream_key: String,
}

#[async_trait::async_trait]
impl CompletionHook for ChargeHook {
    async fn completed(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        delivery: &Delivery,
        completion: &Completion,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let matched = match completion {
            Completion::Delivered(receipt) => {
                let stripe_id = receipt.0.clone();
                let paid = tx
                    .query(queries::CHARGE_SUCCEEDED, &[&delivery.id, &stripe_id])
                    .await?;
                if self.shipping {
                    for row in &paid {
                        enqueue_shipping(tx, row.try_get(0)?, row.try_get(1)?).await?;
                    }
                }
                paid.len() as u64
            }
            Completion::DeadLettered(reason) => {
                tx.execute(queries::CHARGE_FAILED, &[&delivery.id, reason])
                    .await?
            }
            // An outcome a later txoutbox adds: the charge stays as it is.
            _ => return Ok(()),
        };
        if matched == 0 {
            return Err(Box::new(NoSuchCharge {
                message_id: delivery.id,
                downstream_key: delivery.downstream_key.clone(),
            }));
        }
        Ok(())
    }
}
