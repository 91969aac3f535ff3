//! The relay's feedback into the service: a delivered PaymentIntent marks its charge succeeded
//! with the Stripe id, a dead-lettered one marks it failed. It runs in the relay's completion
//! transaction, so the charge's status and the row's completion commit together.

use txoutbox::{Completion, CompletionHook, Delivery};

use crate::queries;

/// Marks charges `succeeded`/`failed`; register it for the Stripe destination.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChargeHook;

#[async_trait::async_trait]
impl CompletionHook for ChargeHook {
    async fn completed(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        delivery: &Delivery,
        completion: &Completion,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        match completion {
            Completion::Delivered(receipt) => {
                let stripe_id = receipt.0.clone();
                tx.execute(
                    queries::CHARGE_SUCCEEDED,
                    &[&delivery.downstream_key, &stripe_id],
                )
                .await?;
            }
            Completion::DeadLettered(reason) => {
                tx.execute(queries::CHARGE_FAILED, &[&delivery.downstream_key, reason])
                    .await?;
            }
        }
        Ok(())
    }
}
