//! Waiting on what a relay did, by its test events ([`RelayEvent`]), instead of sleeping: "the
//! relay has claimed twice since", "a lease was taken back", "the relay is stopping".
//!
//! ```ignore
//! let mut events = RelayEvents::new();
//! let relay = db.relay()?.config(events.config(relay_config())).sink("email", sink).build()?;
//! let running = RunningRelay::start(relay);
//! events.wait_for(|e| matches!(e, RelayEvent::Reclaimed { .. })).await?;
//! events.claims(2).await?; // two claims that began after this line
//! ```

use std::time::Duration;

use anyhow::Result;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use txoutbox::relay::{RelayConfig, RelayEvent};

use crate::WAIT_LIMIT;

/// How many events a test's relay may send before the test reads them (older ones are lost).
const CAPACITY: usize = 4096;

/// The events of the relays built with [`RelayEvents::config`], received in order.
#[derive(Debug)]
pub struct RelayEvents {
    sender: broadcast::Sender<RelayEvent>,
    receiver: broadcast::Receiver<RelayEvent>,
    /// What the waits so far received, oldest first (named when a wait fails).
    seen: Vec<RelayEvent>,
}

impl Default for RelayEvents {
    fn default() -> Self {
        Self::new()
    }
}

impl RelayEvents {
    /// Listens from now on.
    pub fn new() -> Self {
        let (sender, receiver) = broadcast::channel(CAPACITY);
        Self {
            sender,
            receiver,
            seen: Vec::new(),
        }
    }

    /// `config` with its events sent here.
    pub fn config(&self, config: RelayConfig) -> RelayConfig {
        config.with_test_events(self.sender.clone())
    }

    /// Forgets the events received but not yet waited for: the next wait counts only what
    /// happens from now on.
    pub fn clear(&mut self) {
        loop {
            match self.receiver.try_recv() {
                Ok(event) => self.seen.push(event),
                Err(TryRecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
    }

    /// Waits (up to [`WAIT_LIMIT`]) for the next event that `wanted` accepts, and returns it;
    /// fails naming the events seen.
    pub async fn wait_for(&mut self, wanted: impl Fn(&RelayEvent) -> bool) -> Result<RelayEvent> {
        self.wait_for_within(WAIT_LIMIT, wanted).await
    }

    /// [`wait_for`](Self::wait_for) with a limit of the test's own.
    pub async fn wait_for_within(
        &mut self,
        limit: Duration,
        wanted: impl Fn(&RelayEvent) -> bool,
    ) -> Result<RelayEvent> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let next = tokio::time::timeout_at(deadline, self.receiver.recv()).await;
            match next {
                Ok(Ok(event)) => {
                    self.seen.push(event);
                    if wanted(&event) {
                        return Ok(event);
                    }
                }
                Ok(Err(RecvError::Lagged(_))) => {}
                Ok(Err(RecvError::Closed)) | Err(_) => anyhow::bail!(
                    "no awaited relay event in {limit:?}; the last events: {:?}",
                    self.last_seen()
                ),
            }
        }
    }

    /// Waits for `n` events that `wanted` accepts, received from now on (those received before
    /// are forgotten first); returns the last.
    pub async fn wait_for_n(
        &mut self,
        n: usize,
        wanted: impl Fn(&RelayEvent) -> bool,
    ) -> Result<RelayEvent> {
        self.clear();
        let mut last = None;
        for _ in 0..n {
            last = Some(self.wait_for(&wanted).await?);
        }
        last.ok_or_else(|| anyhow::anyhow!("waited for no event"))
    }

    /// Waits for `n` claims (with rows or without) that end from now on: with `n` ≥ 2, at least
    /// one whole claim began after this call, and saw whatever was committed before it.
    pub async fn claims(&mut self, n: usize) -> Result<()> {
        self.wait_for_n(n, is_claim).await.map(drop)
    }

    /// Waits for the next claim that found nothing to take ([`RelayEvent::Idle`]), from now on:
    /// everything due when it began is claimed or held back.
    pub async fn idle(&mut self) -> Result<()> {
        self.wait_for_n(1, |e| *e == RelayEvent::Idle)
            .await
            .map(drop)
    }

    /// Waits until expired leases were taken back, from now on; returns how many rows.
    pub async fn reclaimed(&mut self) -> Result<usize> {
        match self
            .wait_for_n(1, |e| matches!(e, RelayEvent::Reclaimed { .. }))
            .await?
        {
            RelayEvent::Reclaimed { n } => Ok(n),
            other => anyhow::bail!("waited for a reclaim, got {other:?}"),
        }
    }

    /// Every event received so far (by the waits and [`clear`](Self::clear)), oldest first.
    pub fn seen(&self) -> &[RelayEvent] {
        &self.seen
    }

    fn last_seen(&self) -> &[RelayEvent] {
        &self.seen[self.seen.len().saturating_sub(20)..]
    }
}

/// True for a claim's event, whether it took rows ([`RelayEvent::Claimed`]) or none
/// ([`RelayEvent::Idle`]).
pub fn is_claim(event: &RelayEvent) -> bool {
    matches!(event, RelayEvent::Claimed { .. } | RelayEvent::Idle)
}

impl RelayEvents {
    /// Builds and starts the relay of `builder` with the test timings of
    /// [`relay_config`](crate::relay::relay_config) (replacing any configuration set on it), its
    /// events sent here. A test that needs other timings uses [`start_with`](Self::start_with).
    pub fn start(
        &self,
        builder: txoutbox::relay::RelayBuilder,
    ) -> Result<crate::relay::RunningRelay> {
        self.start_with(builder, crate::relay::relay_config())
    }

    /// [`start`](Self::start) with the timings `config` (replacing any configuration set on
    /// `builder`).
    pub fn start_with(
        &self,
        builder: txoutbox::relay::RelayBuilder,
        config: RelayConfig,
    ) -> Result<crate::relay::RunningRelay> {
        let relay = builder.config(self.config(config)).build()?;
        Ok(crate::relay::RunningRelay::start(relay))
    }
}
