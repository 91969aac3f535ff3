//! The relay's wake-up hint, sent after commit and coalesced.
//!
//! A `NOTIFY` inside the business transaction takes a database-wide lock at commit and serialises
//! every committing transaction. Instead, a service calls [`RelayWaker::wake`] after its commit;
//! one background task sends the hints, at most one per [`HINT_SPACING`]: wakes that arrive in
//! between fold into the next one. A lost hint only delays delivery until the relay's next poll.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::error::Result;
use crate::store::driver::WriteTx;
use crate::store::{self, Pooled};

/// The channel the relays LISTEN on for the write path's hint.
pub const WAKE_CHANNEL: &str = wake_channel!();

/// Sends the relay's wake-up inside the caller's transaction. Postgres delivers it at commit, but
/// every NOTIFY takes a database-wide lock at commit, serialising all committing transactions:
/// prefer [`RelayWaker`] after commit, or leave waking to the relay's poll.
pub async fn notify_in_transaction(mut tx: impl WriteTx) -> Result<()> {
    tx.notify().await?;
    Ok(())
}

/// The shortest time between two hints. A relay with a backlog claims back to back and needs no
/// hint; an idle one is woken within this time of a commit.
pub const HINT_SPACING: Duration = Duration::from_millis(1);

/// A cheap, cloneable handle that asks the relays to look for new rows.
#[derive(Debug, Clone)]
pub struct RelayWaker {
    // Capacity 1: a wake while one is already queued is the same wake.
    queued: mpsc::Sender<()>,
}

impl RelayWaker {
    /// Starts the background task that sends the hints over connections from `pool`.
    /// The task ends when every handle is dropped.
    pub fn spawn(pool: deadpool_postgres::Pool) -> Self {
        let (queued, mut wakes) = mpsc::channel(1);
        tokio::spawn(async move {
            while wakes.recv().await.is_some() {
                match pool.get().await {
                    Ok(client) => {
                        if let Err(e) = store::wake::notify(&Pooled::unnamed(&client)).await {
                            tracing::debug!(error = %e, "relay wake-up hint not sent");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "relay wake-up hint not sent"),
                }
                tokio::time::sleep(HINT_SPACING).await;
            }
        });
        Self { queued }
    }

    /// Asks for a hint after a commit that enqueued rows. Never blocks.
    pub fn wake(&self) {
        // Full means a hint is already queued; closed means the runtime is going away.
        let _ = self.queued.try_send(());
    }
}
