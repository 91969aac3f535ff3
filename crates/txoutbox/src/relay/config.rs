//! The relay's configuration: knobs with defaults, per-destination policies, and the builder that
//! checks them. A configuration that cannot work (a lease shorter than a sink's timeout, a retry
//! cap below its base) is refused here, with one line naming the setting.
//!
//! Layout: this file holds [`RelayConfig`] (the relay-wide knobs: read with getters, set with
//! `with_*` methods, so a new knob breaks no caller); `policy` the per-destination rules;
//! `builder` the [`RelayBuilder`] and its checks.

pub(super) mod builder;
mod policy;

use std::time::Duration;

use uuid::Uuid;

use crate::error::{Error, Result};

pub use builder::RelayBuilder;
pub use policy::{Breaker, DestinationPolicy, FlowControl, RateLimit, Semantics};

/// How the relay learns of new rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WakeMode {
    /// LISTEN for the write path's hint, and poll as a fallback.
    ListenAndPoll,
    /// Poll only (behind PgBouncer in transaction mode, where LISTEN does not work).
    PollOnly,
}

/// The relay's knobs, each with a default ([`RelayConfig::default`]), set one by one:
///
/// ```
/// use std::time::Duration;
/// use txoutbox::relay::{RelayConfig, WakeMode};
///
/// let config = RelayConfig::default()
///     .with_lease(Duration::from_secs(60))
///     .with_poll_interval(Duration::from_millis(250))
///     .with_wake(WakeMode::PollOnly);
/// assert_eq!(config.lease(), Duration::from_secs(60));
/// assert_eq!(config.batch_size(), 500); // the default
/// ```
///
/// Nothing is checked when a knob is set: [`RelayBuilder::build`] refuses a configuration that
/// cannot work, naming the setting.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    // Each knob is documented on its getter, below.
    pub(crate) owner: String,
    pub(crate) batch_size: usize,
    pub(crate) concurrency: usize,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) wake: WakeMode,
    pub(crate) reclaim_interval: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) completion_batch: usize,
    pub(crate) pool_size: usize,
    pub(crate) prepared_statements: bool,
    pub(crate) sample_interval: Duration,
    pub(crate) stranded_sweep_interval: Duration,
    pub(crate) ordering_lock_wait: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) events: super::events::TestEvents,
}

/// After the shutdown grace, how long the relay still tries to write outcomes and give leases
/// back before it returns regardless.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(3);

/// The longest retry delay a policy may have: a row is never scheduled further out (a
/// `Retry-After` of years is capped at the policy's cap, which is at most this).
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(30 * 24 * 60 * 60);

impl Default for RelayConfig {
    fn default() -> Self {
        let host = host_name();
        Self {
            owner: format!(
                "{host}-{}-{}",
                std::process::id(),
                &Uuid::new_v4().simple().to_string()[..6]
            ),
            batch_size: 500,
            concurrency: 64,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            wake: WakeMode::ListenAndPoll,
            reclaim_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            completion_batch: 256,
            pool_size: 4,
            prepared_statements: true,
            sample_interval: Duration::from_secs(5),
            stranded_sweep_interval: Duration::from_secs(10),
            ordering_lock_wait: Duration::from_millis(200),
            heartbeat_interval: Duration::from_secs(5),
            events: super::events::TestEvents::default(),
        }
    }
}

/// This machine's name: `HOSTNAME`, else `/etc/hostname`, else `relay`.
pub(super) fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned())
}

/// Reading the knobs.
impl RelayConfig {
    /// This relay's name in leases and the attempt log (default: host, pid and a random suffix).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Rows claimed per claim statement at most (default 500; claims are sized by the pace of
    /// the sink calls, see the `relay` docs).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Deliveries in flight at once (default 64); a slow sink holds only its own slots.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// How long a claim is ours (default 30 s). Every sink call is cut off before the lease ends
    /// (see [`RelayConfig::call_limit`]), and a sink whose own timeout is longer is refused.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Fallback poll period when no hint arrives (default 1 s).
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// LISTEN + poll, or poll only (default [`WakeMode::ListenAndPoll`]).
    pub fn wake(&self) -> WakeMode {
        self.wake
    }

    /// How often expired leases are taken back (default 1 s).
    pub fn reclaim_interval(&self) -> Duration {
        self.reclaim_interval
    }

    /// How often the relay looks, a thousand ordering keys at a time, for a row written waiting
    /// behind an earlier row of its key that is gone, and makes it due (default 10 s; zero: never).
    /// A safety net for a head deleted by hand or by a path that raced the row's enqueue: the
    /// relay's completion, discard and purge make the next row due themselves
    /// ([`unpark_stranded`](super::unpark_stranded) does the whole sweep at once).
    pub fn stranded_sweep_interval(&self) -> Duration {
        self.stranded_sweep_interval
    }

    /// How long the completion of a row with an ordering key waits for an enqueue transaction
    /// that holds the key's lock (default 200 ms), so that the row that enqueue writes behind it
    /// is seen and made due. Past it the completion goes on without the lock (the transaction
    /// holds the key for long, or waits for a key this completion holds: keep it below
    /// Postgres's `deadlock_timeout`, 1 s by default, so the relay, not the caller's
    /// transaction, gives way) and the row is left to the sweep
    /// ([`stranded_sweep_interval`](Self::stranded_sweep_interval)).
    pub fn ordering_lock_wait(&self) -> Duration {
        self.ordering_lock_wait
    }

    /// At shutdown, how long in-flight deliveries may take to finish (default 10 s). The relay
    /// returns at most [`SHUTDOWN_FLUSH`] after it, whatever the database or the sinks do.
    pub fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    /// Completions written per statement at most (default 256).
    pub fn completion_batch(&self) -> usize {
        self.completion_batch
    }

    /// Connections in the relay's pool (default 4, at least 2), besides the listener's and up
    /// to two for its claims while it bounds no destination.
    pub fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// Run the relay's statements as prepared statements cached per connection (default true).
    /// Turn off behind a connection pooler that cannot carry prepared statements (PgBouncer in
    /// transaction mode before 1.21): statements then go unnamed, one round trip each.
    pub fn prepared_statements(&self) -> bool {
        self.prepared_statements
    }

    /// How often the relay samples the backlog gauges (`txoutbox_pending_messages`,
    /// `txoutbox_oldest_pending_age_seconds`) with one index-only query (default 5 s; zero turns
    /// sampling off).
    pub fn sample_interval(&self) -> Duration {
        self.sample_interval
    }

    /// How often the relay refreshes its row in `txoutbox_relays` (default 5 s): one small
    /// UPDATE. Three missed heartbeats mark it stale in `txoutbox relays` and the dashboard.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }
}

/// Setting the knobs: each returns the configuration, with every other knob unchanged.
impl RelayConfig {
    /// Sets [`RelayConfig::owner`].
    pub fn with_owner(mut self, value: impl Into<String>) -> Self {
        self.owner = value.into();
        self
    }

    /// Sets [`RelayConfig::batch_size`].
    pub fn with_batch_size(mut self, value: usize) -> Self {
        self.batch_size = value;
        self
    }

    /// Sets [`RelayConfig::concurrency`].
    pub fn with_concurrency(mut self, value: usize) -> Self {
        self.concurrency = value;
        self
    }

    /// Sets [`RelayConfig::lease`].
    pub fn with_lease(mut self, value: Duration) -> Self {
        self.lease = value;
        self
    }

    /// Sets [`RelayConfig::poll_interval`].
    pub fn with_poll_interval(mut self, value: Duration) -> Self {
        self.poll_interval = value;
        self
    }

    /// Sets [`RelayConfig::wake`].
    pub fn with_wake(mut self, value: WakeMode) -> Self {
        self.wake = value;
        self
    }

    /// Sets [`RelayConfig::reclaim_interval`].
    pub fn with_reclaim_interval(mut self, value: Duration) -> Self {
        self.reclaim_interval = value;
        self
    }

    /// Sets [`RelayConfig::stranded_sweep_interval`].
    pub fn with_stranded_sweep_interval(mut self, value: Duration) -> Self {
        self.stranded_sweep_interval = value;
        self
    }

    /// Sets [`RelayConfig::ordering_lock_wait`].
    pub fn with_ordering_lock_wait(mut self, value: Duration) -> Self {
        self.ordering_lock_wait = value;
        self
    }

    /// Sets [`RelayConfig::shutdown_grace`].
    pub fn with_shutdown_grace(mut self, value: Duration) -> Self {
        self.shutdown_grace = value;
        self
    }

    /// Sets [`RelayConfig::completion_batch`].
    pub fn with_completion_batch(mut self, value: usize) -> Self {
        self.completion_batch = value;
        self
    }

    /// Sets [`RelayConfig::pool_size`].
    pub fn with_pool_size(mut self, value: usize) -> Self {
        self.pool_size = value;
        self
    }

    /// Sets [`RelayConfig::prepared_statements`].
    pub fn with_prepared_statements(mut self, value: bool) -> Self {
        self.prepared_statements = value;
        self
    }

    /// Sets [`RelayConfig::sample_interval`].
    pub fn with_sample_interval(mut self, value: Duration) -> Self {
        self.sample_interval = value;
        self
    }

    /// Sets [`RelayConfig::heartbeat_interval`].
    pub fn with_heartbeat_interval(mut self, value: Duration) -> Self {
        self.heartbeat_interval = value;
        self
    }

    /// For tests: the relay sends a [`RelayEvent`](super::RelayEvent) to `sender` as it claims,
    /// completes, takes back leases, fans out and stops, so a test waits for what the relay did
    /// rather than sleeping. Not part of the stable API.
    #[doc(hidden)]
    pub fn with_test_events(
        mut self,
        sender: tokio::sync::broadcast::Sender<super::RelayEvent>,
    ) -> Self {
        self.events = super::events::TestEvents::new(sender);
        self
    }
}

impl RelayConfig {
    /// How long one sink call may run: the lease less a margin (a fifth of the lease, at most
    /// 2 s) in which the outcome is written. A call still running then is cut off and counted
    /// as an attempt whose outcome is unknown, so no relay ever holds an attempt past its lease
    /// and no other relay redelivers a row while its call still runs here.
    pub fn call_limit(&self) -> Duration {
        let margin = (self.lease / 5).min(Duration::from_secs(2));
        self.lease.saturating_sub(margin)
    }

    fn check(&self) -> Result<()> {
        let config = |setting: &str, why: String| Err(Error::Config(format!("{setting}: {why}")));
        if self.lease < Duration::from_millis(100) {
            return config(
                "lease",
                format!("{:?} is too short (at least 100 ms)", self.lease),
            );
        }
        if self.lease > Duration::from_secs(24 * 60 * 60) {
            return config(
                "lease",
                format!("{:?} is too long (at most 24 h)", self.lease),
            );
        }
        if self.heartbeat_interval > Duration::from_secs(60 * 60) {
            return config(
                "heartbeat_interval",
                format!("{:?} is too long (at most 1 h)", self.heartbeat_interval),
            );
        }
        if self.owner.is_empty() || self.owner.contains('\0') {
            return config("owner", "must be a non-empty text without NUL".into());
        }
        for (setting, value) in [
            ("poll_interval", self.poll_interval),
            ("reclaim_interval", self.reclaim_interval),
            ("ordering_lock_wait", self.ordering_lock_wait),
            ("heartbeat_interval", self.heartbeat_interval),
        ] {
            if value.is_zero() {
                return config(setting, "must be above zero".into());
            }
        }
        Ok(())
    }
}
