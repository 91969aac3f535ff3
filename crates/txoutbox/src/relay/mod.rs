//! The relay: claims committed outbox rows under a lease, hands them to their sinks, and records
//! the outcome, fenced by the lease token. Many relays (threads, processes, machines) may run at
//! once against one database; row locks coordinate them.
//!
//! Layout, by phase: this module runs the claim loop and the shutdown; `config` holds the knobs
//! and the builder that refuses what cannot work; `claim` takes due rows under a lease (and gives
//! back unstarted ones at shutdown), and `held` tracks them until their outcome is written;
//! `deliver` runs one attempt, bounded by the lease; `complete` writes outcomes in batches (a row
//! whose outcome cannot be written never blocks the others); `maintenance` takes back expired
//! leases and samples the backlog; `flow` is flow control; `presence` keeps the relay's row in `txoutbox_relays` (its
//! heartbeat). Every statement is in the crate's
//! `store` module. [`RelayWaker`] and [`notify_in_transaction`] are the write path's side of the
//! wake-up; [`Shutdown`] is the stop signal every background service here runs with.
//!
//! Delivered rows are moved to `txoutbox_delivered` by the completion statement, so the hot table
//! holds only work in progress and its partial index stays small whatever the history.

mod backoff;
mod claim;
mod complete;
mod config;
mod deliver;
mod events;
mod fan_out;
mod flow;
mod give_back;
mod held;
mod listener;
mod maintenance;
mod presence;
mod startup;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use crate::shutdown::Shutdown;
pub use crate::wake::{notify_in_transaction, RelayWaker, HINT_SPACING, WAKE_CHANNEL};
pub use backoff::RetryPolicy;
pub use config::{
    Breaker, DestinationPolicy, FlowControl, RateLimit, RelayBuilder, RelayConfig, Semantics,
    WakeMode, MAX_RETRY_DELAY, SHUTDOWN_FLUSH,
};
#[doc(hidden)]
pub use events::RelayEvent;
pub use maintenance::reclaim_expired;

use claim::{claim, release_unstarted};
use give_back::{dead_letter_undecodable, given_back, storable};
use held::{Held, Stage};

use crate::sink::{Completion, CompletionHook, Delivery, Sink};
use crate::state::AttemptOutcome;
use crate::{error::Result, pg::PgConfig};

/// The relay engine. `run` it in its own process (`txoutbox relay`) or inside a service.
///
/// Register one [`Sink`] per destination, build, and run it until a shutdown future resolves;
/// `run` then finishes the deliveries in flight (within [`RelayConfig::shutdown_grace`]), gives
/// back the rows it has not started, and returns.
///
/// ```no_run
/// use txoutbox::pg::PgConfig;
/// use txoutbox::relay::{Relay, Shutdown};
/// use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};
///
/// struct Log;
///
/// #[async_trait::async_trait]
/// impl Sink for Log {
///     async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
///         println!("{}: {}", delivery.downstream_key, delivery.payload);
///         Ok(Receipt::none())
///     }
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pg = PgConfig::parse("postgres://relay@db.internal/app")?;
/// let relay = Relay::builder(pg).sink("log", Log).build()?;
/// let shutdown = Shutdown::on_signal()?; // SIGINT or SIGTERM
/// let report = relay.run(shutdown.wait()).await?;
/// println!("claimed {} rows, gave back {}", report.claimed, report.released);
/// # Ok(())
/// # }
/// ```
///
/// The runnable version is the crate's `custom_sink` example
/// (`cargo run -p txoutbox --example custom_sink`).
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

struct Inner {
    pg: PgConfig,
    pool: deadpool_postgres::Pool,
    config: RelayConfig,
    sinks: HashMap<String, Arc<dyn Sink>>,
    hooks: HashMap<String, Arc<dyn CompletionHook>>,
    policies: HashMap<String, DestinationPolicy>,
    default_policy: DestinationPolicy,
    wake: Arc<Notify>,
    /// The last full claim saw a destination with a flow-control state (until a claim sees
    /// none, claims carry the flow-control branches).
    flow_seen: AtomicBool,
    listener_connected: Arc<AtomicBool>,
    flow: flow::Flow,
    /// Keys whose deferred effects this relay found poisoned.
    poisoned: fan_out::Poisoned,
    /// What the heartbeat reports (the last claim).
    presence: presence::Presence,
}

impl Inner {
    fn policy(&self, destination: &str) -> &DestinationPolicy {
        self.policies
            .get(destination)
            .unwrap_or(&self.default_policy)
    }

    fn at_most_once(&self, destination: &str) -> bool {
        self.policy(destination).semantics == Semantics::AtMostOnce
    }
}

/// What a relay did between `run` and its return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Rows claimed.
    pub claimed: u64,
    /// Rows given back at shutdown (not finished within the grace period).
    pub released: u64,
}

/// A row this relay holds under a lease, with what its completion needs.
#[derive(Debug, Clone)]
struct Lease {
    delivery: Delivery,
    token: i64,
    /// The attempt's start, by the database's clock (the claim's `now()`).
    started: DateTime<Utc>,
    /// When the claim's rows arrived, by this process's monotonic clock.
    claimed_at: std::time::Instant,
}

impl Lease {
    /// Now, by the database's clock: the claim's time plus the time elapsed here since. Every
    /// time the relay records (attempt end, delivery, latency) is on the clock `created_at` and
    /// `started_at` come from, so a relay machine whose clock is off records no negative or
    /// inflated durations.
    fn now(&self) -> DateTime<Utc> {
        let elapsed = chrono::Duration::from_std(self.claimed_at.elapsed()).unwrap_or_default();
        self.started + elapsed
    }
}

/// What became of an attempt; `as_str` is what the completion statement and the attempt log
/// store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The downstream accepted it: the row moves to the history.
    Delivered,
    /// It failed retryably: pending again after a delay.
    Retry,
    /// Dead-lettered.
    Failed,
    /// An at-most-once call whose outcome is not known: an operator decides.
    Unknown,
    /// Given back at shutdown after its call started: pending again at once.
    Released,
    /// Given back before its call started: pending again, the attempt not counted.
    Unstarted,
}

impl Outcome {
    /// What the attempt log stores for it ([`AttemptOutcome`]); `None` for an unstarted row,
    /// which is given back without an attempt row.
    fn logged(self) -> Option<AttemptOutcome> {
        match self {
            Outcome::Delivered => Some(AttemptOutcome::Delivered),
            Outcome::Retry => Some(AttemptOutcome::Retry),
            Outcome::Failed => Some(AttemptOutcome::Failed),
            Outcome::Unknown => Some(AttemptOutcome::Unknown),
            Outcome::Released => Some(AttemptOutcome::Released),
            Outcome::Unstarted => None,
        }
    }

    /// The value the completion statement reads (`unstarted` is the relay's own).
    fn as_str(self) -> &'static str {
        self.logged().map_or("unstarted", AttemptOutcome::as_str)
    }
}

/// The outcome of one attempt, waiting to be written.
#[derive(Debug, Clone)]
struct Finished {
    lease: Lease,
    outcome: Outcome,
    error: Option<String>,
    receipt: Option<String>,
    delay: Duration,
    finished: DateTime<Utc>,
    completion: Option<Completion>,
    /// What the attempt tells the destination's breaker (none for a permanent failure or a row
    /// given back).
    signal: Option<flow::Signal>,
}

/// How often, at least, a relay claiming back to back through a backlog fans out deferred
/// effects: the fan-out's statement is planned at each run, so it does not run beside every claim
/// of a drain, yet deferred effects never wait behind a backlog for longer than this.
const FAN_OUT_INTERVAL: Duration = Duration::from_millis(50);

/// How long the claim loop waits, at shutdown, for a claim already sent: its UPDATE commits on
/// the server whether or not anyone waits, so the relay waits for its rows and gives them back.
const CLAIM_WAIT: Duration = Duration::from_secs(2);

impl Relay {
    /// Starts building a relay over the database `pg` points to: a [`PgConfig`] (TLS as its
    /// `sslmode` says) or a `tokio_postgres::Config` (its `sslmode`, without certificate checks).
    pub fn builder(pg: impl Into<PgConfig>) -> RelayBuilder {
        RelayBuilder {
            pg: pg.into(),
            config: RelayConfig::default(),
            sinks: HashMap::new(),
            hooks: HashMap::new(),
            policies: HashMap::new(),
            default_policy: DestinationPolicy::default(),
        }
    }

    /// This relay's owner id, as written in leases and the attempt log.
    pub fn owner(&self) -> &str {
        &self.inner.config.owner
    }

    /// Wakes the claimer now (for a service that runs the relay in-process and enqueues itself).
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// True while the LISTEN connection is up (always false in poll-only mode).
    pub fn listener_connected(&self) -> bool {
        self.inner.listener_connected.load(Ordering::Relaxed)
    }

    /// The relay's connection pool (for health checks).
    pub fn pool(&self) -> &deadpool_postgres::Pool {
        &self.inner.pool
    }

    /// Runs until `shutdown` resolves, then stops claiming, lets in-flight deliveries finish
    /// within the grace period, gives back the leases of the rest, writes every outcome it can,
    /// and returns, at most [`SHUTDOWN_FLUSH`] after the grace period whatever the database or
    /// the sinks do. Database outages are waited out (the pool reconnects); they never end the
    /// run.
    ///
    /// Before its first claim it checks the database's schema ([`check_schema`](crate::check_schema),
    /// waiting for an unreachable database) and fails with [`Error::Schema`](crate::Error::Schema)
    /// when it is not the version this build needs: never migrated, behind, or migrated by a
    /// newer txoutbox.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<RelayReport> {
        let inner = self.inner.clone();
        let config = &inner.config;
        tokio::pin!(shutdown);
        if !startup::schema_matches(&inner, shutdown.as_mut()).await? {
            return Ok(RelayReport::default());
        }
        crate::telemetry::register_destinations(inner.sinks.keys());
        let stop = Arc::new(Notify::new());
        let mut background = maintenance::spawn(&inner, &stop);
        let (done, results) = mpsc::channel::<Finished>(config.concurrency.max(1) * 2);
        let shutting_down = Arc::new(AtomicBool::new(false));
        let held = Held::default();
        let heartbeat = presence::Heartbeat::start(inner.clone(), held.clone());
        let mut completer = tokio::spawn(complete::completer(
            inner.clone(),
            results,
            shutting_down.clone(),
            held.clone(),
        ));

        let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
        let mut deliveries = JoinSet::new();
        let mut report = RelayReport::default();
        let mut failures = 0u32;
        let mut registered = false;
        // Fan out before the next claim: at start, after a wake-up (the write path's hint, a
        // poll), after a fan-out that left keys to fan out, and at least every FAN_OUT_INTERVAL
        // while a backlog keeps the loop claiming back to back.
        let mut fan_out_due = true;
        let mut last_fan_out = Instant::now();
        let stopping_at = loop {
            while deliveries.try_join_next().is_some() {}
            let free = slots.available_permits();
            if free == 0 {
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break Instant::now(),
                    permit = slots.acquire() => { drop(permit); continue; }
                }
            }
            let want = free.min(config.batch_size.max(1));
            if !registered {
                match flow::register(&inner).await {
                    Ok(()) => registered = true,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not record the destinations' rate limits; will try again")
                    }
                }
            }
            let bounds = inner.flow.bounds(&inner, want, &held.per_destination());
            let fan_out = fan_out_due || last_fan_out.elapsed() >= FAN_OUT_INTERVAL;
            if fan_out {
                last_fan_out = Instant::now();
            }
            let claim = claim(&inner, want, held.ids(), &bounds, fan_out);
            tokio::pin!(claim);
            let (claimed, stopping) = tokio::select! {
                biased;
                _ = &mut shutdown => {
                    // The claim's UPDATE commits on the server whether or not we wait: take its
                    // rows (to give them back) rather than leave them leased by a relay that left.
                    let at = Instant::now();
                    match tokio::time::timeout(CLAIM_WAIT, &mut claim).await {
                        Ok(claimed) => (claimed, Some(at)),
                        Err(_) => break at,
                    }
                }
                claimed = &mut claim => (claimed, None),
            };
            let claim::Claimed {
                leases: rows,
                undecodable,
                again,
                fan_out_more,
                next_change,
            } = match claimed {
                Ok(claimed) => {
                    failures = 0;
                    claimed
                }
                Err(e) => {
                    if let Some(at) = stopping {
                        break at;
                    }
                    failures += 1;
                    tracing::warn!(error = %e, "claim failed; retrying");
                    let pause = Duration::from_millis(50 * 2u64.pow(failures.min(6)))
                        .min(config.poll_interval.max(Duration::from_millis(100)));
                    tokio::select! {
                        biased;
                        _ = &mut shutdown => break Instant::now(),
                        _ = tokio::time::sleep(pause) => continue,
                    }
                }
            };
            report.claimed += (rows.len() + undecodable.len()) as u64;
            inner.config.events.claimed(rows.len() + undecodable.len());
            if let Some(at) = stopping {
                for lease in rows
                    .into_iter()
                    .chain(undecodable.into_iter().map(|(l, _)| l))
                {
                    held.insert(lease);
                }
                break at;
            }
            fan_out_due = fan_out_more;
            let full = rows.len() + undecodable.len() == want || again;
            for (lease, error) in undecodable {
                dead_letter_undecodable(&held, &done, lease, error).await;
            }
            for lease in rows {
                if held.contains(lease.delivery.id) {
                    // Cannot happen (the claim skips held rows); never run two attempts of one row.
                    let _ = done
                        .send(given_back(&inner, lease, Outcome::Unstarted))
                        .await;
                    continue;
                }
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    // Cannot happen (only this loop takes slots); give the row back rather than lose it.
                    let _ = done
                        .send(given_back(&inner, lease, Outcome::Unstarted))
                        .await;
                    continue;
                };
                held.insert(lease.clone());
                let not_before = inner
                    .flow
                    .slot(&lease.delivery.destination, config.lease / 4);
                let (inner, done, held) = (inner.clone(), done.clone(), held.clone());
                deliveries.spawn(async move {
                    let (id, token) = (lease.delivery.id, lease.token);
                    if let Some(at) = not_before {
                        // Paced: a rate-limited destination's calls go out spaced at its rate.
                        tokio::time::sleep_until(at).await;
                    }
                    let finished = deliver::deliver(&inner, lease, &held).await;
                    // Queue the outcome and mark it queued with no await in between: a task
                    // aborted at shutdown has either queued its outcome or left the row to be
                    // given back, never both.
                    if let Ok(slot) = done.reserve().await {
                        slot.send(finished);
                        held.set(id, token, Stage::Finished);
                    }
                    drop(permit);
                });
            }
            if full {
                continue; // a backlog: claim again at once
            }
            // A destination held back (tokens spent, a breaker's cool-down) may have rows again
            // before the next poll: wait no longer than that.
            let wait = next_change.map_or(config.poll_interval, |d| d.min(config.poll_interval));
            tokio::select! {
                biased;
                _ = &mut shutdown => break Instant::now(),
                _ = inner.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
            fan_out_due = true;
        };

        // Shutdown: no more claims; let deliveries finish within the grace period (counted from
        // the shutdown signal), then give back the rest and flush, bounded by SHUTDOWN_FLUSH.
        tracing::info!(owner = %config.owner, in_flight = deliveries.len(), "relay stopping");
        config.events.emit(events::RelayEvent::Stopping);
        let grace_end = stopping_at + config.shutdown_grace;
        let drained = tokio::time::timeout_at(grace_end, async {
            while deliveries.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            deliveries.abort_all();
            while deliveries.join_next().await.is_some() {}
        }
        shutting_down.store(true, Ordering::Relaxed);
        let flush_end = Instant::now().max(grace_end) + SHUTDOWN_FLUSH;
        for (lease, stage) in held.unfinished() {
            let outcome = match stage {
                Stage::Claimed => Outcome::Unstarted,
                _ => {
                    report.released += 1;
                    Outcome::Released
                }
            };
            let finished = given_back(&inner, lease, outcome);
            if tokio::time::timeout_at(flush_end, done.send(finished))
                .await
                .is_err()
            {
                break;
            }
        }
        drop(done);
        if tokio::time::timeout_at(flush_end, &mut completer)
            .await
            .is_err()
        {
            tracing::error!("outcomes not written within the shutdown flush; their leases will expire and the rows be delivered again");
            completer.abort();
        }
        // Whatever this relay still holds without having called its sink goes back now.
        let sweep_end = flush_end.max(Instant::now() + Duration::from_millis(500));
        match tokio::time::timeout_at(sweep_end, release_unstarted(&inner, held.called())).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(rows = n, "gave back rows claimed as the relay stopped"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not give back unstarted rows; their leases will expire")
            }
            Err(_) => {
                tracing::warn!("giving back unstarted rows timed out; their leases will expire")
            }
        }
        stop.notify_waiters();
        background.abort_all();
        while background.join_next().await.is_some() {}
        heartbeat.stop().await;
        tracing::info!(owner = %config.owner, claimed = report.claimed, released = report.released, "relay stopped");
        Ok(report)
    }
}

#[cfg(test)]
mod tests;
