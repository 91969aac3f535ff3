//! Dispatch: each claimed row becomes a delivery task that waits for one of the relay's
//! `concurrency` slots (the local queue: a claim may take more rows than there are free slots)
//! and holds it through the sink call; its outcome is queued for the completer. Rows the relay
//! cannot decode are dead-lettered without a sink call.
//!
//! How many rows the claim loop takes ([`Dispatch::room`]) follows the pace of the sink calls:
//! the free slots when the sinks are slow or their pace is not known yet (an idle relay claims
//! small), up to the batch size when the running calls will start the queued rows within a
//! quarter of the lease. A row that still waited in the queue for half the call limit is given
//! back without a call (see `deliver`), and a row that gets a slot after the shutdown signal is
//! left for the shutdown to give back.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify, Semaphore};
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
    /// Rows handed out and waiting for a slot (the local queue).
    queued: Arc<AtomicUsize>,
    /// Notified each time a queued row takes a slot.
    pub took: Arc<Notify>,
    /// Set at shutdown: a row that takes a slot afterwards is not called.
    stopping: Arc<AtomicBool>,
    /// The recent sink calls' duration, in nanoseconds (a moving average; 0 while unknown).
    call_nanos: Arc<AtomicU64>,
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
            queued: Arc::default(),
            took: Arc::default(),
            stopping: Arc::default(),
            call_nanos: Arc::default(),
        }
    }

    /// How many rows to claim now (0: the queue is deep enough; wait for [`Dispatch::took`]).
    pub(super) fn room(&mut self) -> usize {
        while self.deliveries.try_join_next().is_some() {}
        let config = &self.inner.config;
        room(
            self.slots.available_permits(),
            self.queued.load(Ordering::Relaxed),
            config.batch_size.max(1),
            config.concurrency.max(1),
            Duration::from_nanos(self.call_nanos.load(Ordering::Relaxed)),
            config.lease / 4,
        )
    }

    /// From now on, rows that take a slot are not called (the shutdown gives them back), and
    /// rows waiting for one stop waiting.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.slots.close();
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
            self.held.insert(lease.clone());
            self.queued.fetch_add(1, Ordering::Relaxed);
            self.spawn(lease);
        }
    }

    async fn give_back(&self, lease: Lease) {
        let _ = self
            .done
            .send(given_back(&self.inner, lease, Outcome::Unstarted))
            .await;
    }

    /// Runs one delivery on a task of its own, once it has a slot, holding the slot until its
    /// outcome is queued.
    fn spawn(&mut self, lease: Lease) {
        let (inner, done, held) = (self.inner.clone(), self.done.clone(), self.held.clone());
        let (slots, queued, took) = (self.slots.clone(), self.queued.clone(), self.took.clone());
        let (stopping, call_nanos) = (self.stopping.clone(), self.call_nanos.clone());
        self.deliveries.spawn(async move {
            let permit = slots.acquire_owned().await;
            queued.fetch_sub(1, Ordering::Relaxed);
            took.notify_one();
            let Ok(permit) = permit else {
                return; // closed at shutdown: the row is given back
            };
            if stopping.load(Ordering::SeqCst) {
                return; // the shutdown gives the row back, uncalled
            }
            let (id, token) = (lease.delivery.id, lease.token);
            let not_before = inner
                .flow
                .slot(&lease.delivery.destination, inner.config.lease / 4);
            if let Some(at) = not_before {
                // Paced: a rate-limited destination's calls go out spaced at its rate.
                tokio::time::sleep_until(at).await;
            }
            let started = std::time::Instant::now();
            let finished = deliver::deliver(&inner, lease, &held).await;
            average(&call_nanos, started.elapsed());
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

/// Folds one call's duration into the moving average (an eighth of the new one).
fn average(nanos: &AtomicU64, took: Duration) {
    let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
    let _ = nanos.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        Some(if old == 0 {
            took
        } else {
            old - old / 8 + took / 8
        })
    });
}

/// How many rows to claim: up to the rows the running calls will start within `horizon` at
/// their recent pace (`call` each, `concurrency` at once), at least the `free` slots, at most
/// `batch` rows waiting or claimed; nothing while more than half of that still waits.
fn room(
    free: usize,
    queued: usize,
    batch: usize,
    concurrency: usize,
    call: Duration,
    horizon: Duration,
) -> usize {
    let paced = if call.is_zero() {
        0
    } else {
        let per_slot = horizon.as_secs_f64() / call.as_secs_f64();
        (per_slot * concurrency as f64).min(batch as f64) as usize
    };
    let target = free.max(paced).min(batch);
    if queued * 2 > target {
        0
    } else {
        target.saturating_sub(queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HORIZON: Duration = Duration::from_millis(7500);

    #[test]
    fn an_idle_relay_or_slow_sinks_claim_the_free_slots() {
        assert_eq!(room(64, 0, 500, 64, Duration::ZERO, HORIZON), 64);
        assert_eq!(room(64, 0, 500, 64, Duration::from_secs(30), HORIZON), 64);
        assert_eq!(room(10, 0, 500, 64, Duration::from_secs(30), HORIZON), 16);
    }

    #[test]
    fn fast_sinks_claim_up_to_the_batch() {
        assert_eq!(
            room(64, 0, 500, 64, Duration::from_micros(20), HORIZON),
            500
        );
        assert_eq!(
            room(0, 200, 500, 64, Duration::from_micros(20), HORIZON),
            300
        );
    }

    #[test]
    fn a_queue_over_half_full_claims_nothing() {
        assert_eq!(room(0, 251, 500, 64, Duration::from_micros(20), HORIZON), 0);
        assert_eq!(room(0, 1, 500, 64, Duration::ZERO, HORIZON), 0);
    }

    #[test]
    fn the_batch_bounds_the_claim_whatever_the_free_slots() {
        assert_eq!(room(64, 0, 10, 64, Duration::ZERO, HORIZON), 10);
    }
}
