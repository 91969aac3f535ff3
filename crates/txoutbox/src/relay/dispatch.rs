//! Dispatch: each claimed row becomes a delivery task holding one of the relay's `concurrency`
//! slots; its outcome is queued for the completer. Rows the relay cannot decode are dead-lettered
//! without a sink call.

use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::give_back::{dead_letter_undecodable, given_back};
use super::held::{Held, Stage};
use super::{deliver, Finished, Inner, Lease, Outcome};

/// What dispatching needs: the delivery slots, the running deliveries, the rows held, and the
/// completer's queue.
pub(super) struct Dispatch {
    pub inner: Arc<Inner>,
    pub slots: Arc<Semaphore>,
    pub deliveries: JoinSet<()>,
    pub held: Held,
    pub done: mpsc::Sender<Finished>,
}

impl Dispatch {
    pub(super) fn new(inner: Arc<Inner>, held: Held, done: mpsc::Sender<Finished>) -> Self {
        let slots = Arc::new(Semaphore::new(inner.config.concurrency.max(1)));
        Dispatch {
            inner,
            slots,
            deliveries: JoinSet::new(),
            held,
            done,
        }
    }

    /// The delivery slots free now (finished deliveries reaped first).
    pub(super) fn free(&mut self) -> usize {
        while self.deliveries.try_join_next().is_some() {}
        self.slots.available_permits()
    }

    /// Hands a claim's rows out: the undecodable ones dead-lettered, each other one to a
    /// delivery task of its own.
    pub(super) async fn rows(&mut self, rows: Vec<Lease>, undecodable: Vec<(Lease, String)>) {
        for (lease, error) in undecodable {
            dead_letter_undecodable(&self.held, &self.done, lease, error).await;
        }
        for lease in rows {
            if self.held.contains(lease.delivery.id) {
                // Cannot happen (the claim skips held rows); never run two attempts of one row.
                self.give_back(lease).await;
                continue;
            }
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                // Cannot happen (only the claim loop takes slots); give the row back rather than
                // lose it.
                self.give_back(lease).await;
                continue;
            };
            self.held.insert(lease.clone());
            self.spawn(lease, permit);
        }
    }

    async fn give_back(&self, lease: Lease) {
        let _ = self
            .done
            .send(given_back(&self.inner, lease, Outcome::Unstarted))
            .await;
    }

    /// Runs one delivery on a task of its own, holding `permit` until its outcome is queued.
    fn spawn(&mut self, lease: Lease, permit: OwnedSemaphorePermit) {
        let not_before = self
            .inner
            .flow
            .slot(&lease.delivery.destination, self.inner.config.lease / 4);
        let (inner, done, held) = (self.inner.clone(), self.done.clone(), self.held.clone());
        self.deliveries.spawn(async move {
            let (id, token) = (lease.delivery.id, lease.token);
            if let Some(at) = not_before {
                // Paced: a rate-limited destination's calls go out spaced at its rate.
                tokio::time::sleep_until(at).await;
            }
            let finished = deliver::deliver(&inner, lease, &held).await;
            // Queue the outcome and mark it queued with no await in between: a task aborted at
            // shutdown has either queued its outcome or left the row to be given back, never
            // both.
            if let Ok(slot) = done.reserve().await {
                slot.send(finished);
                held.set(id, token, Stage::Finished);
            }
            drop(permit);
        });
    }
}
