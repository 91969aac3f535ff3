//! The relay: claims committed outbox rows under a lease, hands them to their sinks, and records
//! the outcome, fenced by the lease token. Many relays (threads, processes, machines) may run at
//! once against one database; row locks coordinate them.
//!
//! Layout, by phase: [`Relay::run`] starts the services and runs three phases, each with a
//! context of its own: `claim_loop` (claims while delivery slots are free, waits for a wake-up
//! or the poll interval when no backlog is left), `dispatch` (a delivery task per claimed row),
//! and `finalize` (the shutdown drain). `config` holds the knobs
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
mod claim_loop;
mod complete;
mod config;
mod deliver;
mod dispatch;
mod events;
mod fan_out;
mod finalize;
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
use tokio::sync::{mpsc, Notify};

pub use crate::shutdown::Shutdown;
pub use crate::wake::{notify_in_transaction, RelayWaker, HINT_SPACING, WAKE_CHANNEL};
pub use backoff::RetryPolicy;
pub use config::{
    Breaker, DestinationPolicy, FlowControl, RateLimit, RelayBuilder, RelayConfig, Semantics,
    WakeMode, MAX_RETRY_DELAY, SHUTDOWN_FLUSH,
};
#[doc(hidden)]
pub use events::RelayEvent;
pub use maintenance::{reclaim_expired, unpark_stranded};

use give_back::storable;
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
    /// The sessions of the claims of a relay that bounds no destination (generic plans:
    /// `config::builder::CLAIM_SESSION`).
    claim_pool: deadpool_postgres::Pool,
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

/// How long after a fan-out last found deferred effects each wake-up fans out too, beside its
/// claim. Past it, a wake-up only claims: a fan-out costs a statement, and one beside every claim
/// a commit wakes slowed the claims of services that defer nothing (commit → sink p50 2.55 →
/// 2.03 ms at 1 000/s). Deferred effects then wait for the next fan-out, at most
/// [`FAN_OUT_INTERVAL`] after the last while claims are sent, or the poll.
const FAN_OUT_ON_WAKE_FOR: Duration = Duration::from_secs(60);

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
        tokio::pin!(shutdown);
        if !startup::schema_matches(&inner, shutdown.as_mut()).await? {
            return Ok(RelayReport::default());
        }
        crate::telemetry::register_destinations(inner.sinks.keys());
        let stop = Arc::new(Notify::new());
        let background = maintenance::spawn(&inner, &stop);
        // Room for two completion batches: the completer takes a whole batch at once.
        let queue = (inner.config.concurrency.max(1) * 2).max(inner.config.completion_batch * 2);
        let (done, results) = mpsc::channel::<Finished>(queue);
        let shutting_down = Arc::new(AtomicBool::new(false));
        let held = Held::default();
        let heartbeat = presence::Heartbeat::start(inner.clone(), held.clone());
        let completer = tokio::spawn(complete::completer(
            inner.clone(),
            results,
            shutting_down.clone(),
            held.clone(),
        ));
        let services = finalize::Services {
            stop,
            background,
            shutting_down,
            heartbeat,
            completer,
        };
        let mut dispatch = dispatch::Dispatch::new(inner, held, done);
        let mut report = RelayReport::default();
        let stopping_at = claim_loop::ClaimLoop::new(&mut dispatch, &mut report)
            .run(shutdown.as_mut())
            .await;
        finalize::finalize(dispatch, services, stopping_at, &mut report).await;
        Ok(report)
    }
}

#[cfg(test)]
mod tests;
