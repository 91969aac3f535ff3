//! Events a running relay reports for tests, as River's test signals: a test waits for "the
//! relay has claimed twice since" or "the lease was taken back" instead of sleeping and hoping.
//! Off unless a test asks for them ([`RelayConfig::with_test_events`](super::RelayConfig::with_test_events));
//! each emit is one line in the phase it reports, and costs a branch when off.

use tokio::sync::broadcast;

/// What a relay did, as it did it. The numbers are rows (or keys, for a fan-out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayEvent {
    /// A claim took `n` rows (n ≥ 1) under a lease.
    Claimed {
        /// Rows claimed.
        n: usize,
    },
    /// A claim found nothing it could take (nothing due, or everything due held back by flow
    /// control or by this relay's own leases).
    Idle,
    /// The completer is done with `n` outcomes: written, or refused by the database for good
    /// (their leases then expire).
    Completed {
        /// Outcomes in the batch.
        n: usize,
    },
    /// Expired leases were taken back: `n` rows are pending again.
    Reclaimed {
        /// Rows taken back.
        n: usize,
    },
    /// A fan-out moved the deferred effects of `n` keys into the outbox.
    FannedOut {
        /// Keys fanned out.
        n: usize,
    },
    /// A fan-out looked for deferred effects (before it knows whether it finds any).
    LookedForEffects,
    /// The shutdown signal arrived: no more claims; the relay drains and returns.
    Stopping,
}

/// Where a relay sends its [`RelayEvent`]s: nowhere unless a test gave it a sender.
#[derive(Debug, Clone, Default)]
pub(crate) struct TestEvents(Option<broadcast::Sender<RelayEvent>>);

impl TestEvents {
    pub(crate) fn new(sender: broadcast::Sender<RelayEvent>) -> Self {
        Self(Some(sender))
    }

    /// Sends `event` to whoever listens (nobody listening is not an error).
    pub(crate) fn emit(&self, event: RelayEvent) {
        if let Some(sender) = &self.0 {
            let _ = sender.send(event);
        }
    }

    /// A claim's event: [`RelayEvent::Claimed`] for `n` rows, [`RelayEvent::Idle`] for none.
    pub(crate) fn claimed(&self, n: usize) {
        self.emit(match n {
            0 => RelayEvent::Idle,
            n => RelayEvent::Claimed { n },
        });
    }
}
