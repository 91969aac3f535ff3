//! The relay's feedback into the service: a delivered PaymentIntent marks its charge succeeded
//! with the Stripe id, a dead-lettered one marks it failed. It runs in the relay's completion
//! transaction, so the charge's status and the row's completion commit together.
//!
//! The charge is found by the outbox message's id, stored on the charge at enqueue: the id never
//! changes, while the downstream key does when an operator replays the row with `--new-key`.

use txoutbox::sink::{Completion, CompletionHook, Delivery};

use crate::queries;

/// Marks charges `succeeded`/`failed`; register it for the Stripe destination.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChargeHook;

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
                tx.execute(queries::CHARGE_SUCCEEDED, &[&delivery.id, &stripe_id])
                    .await?
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
