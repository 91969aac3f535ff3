//! A service's own table written by a completion hook, as the charge examples do: a `charges`
//! table whose rows a [`MarkCharge`](crate::hooks::MarkCharge) hook marks `succeeded` or
//! `failed` in the completion's transaction, with switches to make it fail, or wait, on purpose.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use tokio::sync::{Notify, Semaphore};
use tokio_postgres::Client;
use txoutbox::sink::{Completion, CompletionHook, Delivery};

/// Creates the service's `charges (key, status)` table with one `pending` charge for each of
/// `keys` (the downstream keys of the rows that will complete them).
pub async fn charges_table(client: &Client, keys: &[&str]) -> Result<()> {
    client
        .batch_execute("CREATE TABLE charges (key text PRIMARY KEY, status text NOT NULL)")
        .await?;
    for key in keys {
        client
            .execute(
                "INSERT INTO charges (key, status) VALUES ($1, 'pending')",
                &[key],
            )
            .await?;
    }
    Ok(())
}

/// The status of the charge `key`.
pub async fn charge_status(client: &Client, key: &str) -> Result<String> {
    Ok(client
        .query_one("SELECT status FROM charges WHERE key = $1", &[&key])
        .await?
        .get(0))
}

/// Marks a row's charge `succeeded` (delivered) or `failed` (dead-lettered) in the completion's
/// transaction. Fails (`the charges table is locked`) while [`fail`](Self::fail) is set, and
/// waits for a permit of [`gate`](Self::gate) when it has one; notifies
/// [`entered`](Self::entered) each time it is called.
#[derive(Clone, Default)]
pub struct MarkCharge {
    /// While set, the hook fails.
    pub fail: Arc<AtomicBool>,
    /// Notified as the hook is entered.
    pub entered: Arc<Notify>,
    /// When given, the hook waits for a permit before it writes.
    pub gate: Option<Arc<Semaphore>>,
}

impl MarkCharge {
    /// A hook that fails until its `fail` is cleared.
    pub fn failing() -> Self {
        let hook = Self::default();
        hook.fail.store(true, Ordering::Relaxed);
        hook
    }

    /// A hook that waits for a permit of `gate` each time.
    pub fn gated(gate: Arc<Semaphore>) -> Self {
        Self {
            gate: Some(gate),
            ..Self::default()
        }
    }
}

#[async_trait::async_trait]
impl CompletionHook for MarkCharge {
    async fn completed(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        delivery: &Delivery,
        completion: &Completion,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.entered.notify_one();
        if let Some(gate) = &self.gate {
            let _permit = gate.acquire().await?;
        }
        if self.fail.load(Ordering::Relaxed) {
            return Err("the charges table is locked".into());
        }
        let status = match completion {
            Completion::Delivered(_) => "succeeded",
            Completion::DeadLettered(_) => "failed",
            other => return Err(format!("a completion this hook does not know: {other:?}").into()),
        };
        tx.execute(
            "UPDATE charges SET status = $1 WHERE key = $2",
            &[&status, &delivery.downstream_key],
        )
        .await?;
        Ok(())
    }
}
