//! The relay's configuration: knobs with defaults, per-destination policies, and the builder that
//! checks them. A configuration that cannot work (a lease shorter than a sink's timeout, a retry
//! cap below its base) is refused here, with one line naming the setting.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

use super::backoff::RetryPolicy;
use super::{Inner, Relay};
use crate::sink::{CompletionHook, Sink};
use crate::{
    error::{Error, Result},
    pg::PgConfig,
};

/// What a destination's downstream can do with a redelivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Semantics {
    /// The downstream deduplicates on the forwarded key: a row whose attempt was cut short is
    /// delivered again, with the same key (the default).
    #[default]
    AtLeastOnce,
    /// The downstream cannot deduplicate: the attempt's start is committed just before the call,
    /// and a row whose call may have reached the downstream without an answer (a lease that
    /// expired mid-call, a timeout after sending) goes to `unknown` for an operator to decide.
    AtMostOnce,
}

/// Per-destination delivery rules.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DestinationPolicy {
    /// Backoff and attempt limit.
    pub retry: RetryPolicy,
    /// At-least-once or at-most-once.
    pub semantics: Semantics,
    /// How fast and how many at once the downstream is called, and when it is left alone.
    pub flow: FlowControl,
}

/// A destination's flow control. The rate limit and the breaker's state are shared by every
/// relay of the database (`txoutbox_destinations`); the in-flight limit is this relay's.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowControl {
    /// At most this many calls per second across every relay (default: none).
    pub rate_limit: Option<RateLimit>,
    /// At most this many calls in flight at once on this relay (default: only the relay-wide
    /// [`RelayConfig::concurrency`]).
    pub max_in_flight: Option<usize>,
    /// Leave a failing downstream alone for a while (default: [`Breaker::default`]); `None`
    /// turns the breaker off (a downstream throttling most calls still pauses the destination).
    pub breaker: Option<Breaker>,
}

impl Default for FlowControl {
    fn default() -> Self {
        Self {
            rate_limit: None,
            max_in_flight: None,
            breaker: Some(Breaker::default()),
        }
    }
}

/// A token bucket: `per_second` tokens a second, at most `burst` saved up. Each call takes one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Calls per second, on average.
    pub per_second: f64,
    /// Calls that may go at once after a quiet spell (at least 1).
    pub burst: f64,
}

impl RateLimit {
    /// `n` calls a second, with bursts of a tenth of a second's worth (at least 1): over any
    /// second, at most `n` plus that burst.
    pub fn per_second(n: f64) -> Self {
        Self {
            per_second: n,
            burst: (n / 10.0).max(1.0),
        }
    }
}

impl std::str::FromStr for RateLimit {
    type Err = Error;

    /// `N/s`, `N/m` or `N/h` (`20/s`, `1200/m`, `0.5/s`).
    fn from_str(text: &str) -> Result<Self> {
        let invalid = || {
            Error::Config(format!(
                "rate limit {text:?}: expected N/s, N/m or N/h (e.g. 20/s)"
            ))
        };
        let (n, unit) = text.trim().split_once('/').ok_or_else(invalid)?;
        let n: f64 = n.trim().parse().map_err(|_| invalid())?;
        let per = match unit.trim() {
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        let limit = RateLimit::per_second(n / per);
        check_rate(text, &limit)?;
        Ok(limit)
    }
}

fn check_rate(what: &str, limit: &RateLimit) -> Result<()> {
    if !(limit.per_second.is_finite() && limit.per_second > 0.0 && limit.per_second <= 1e6) {
        return Err(Error::Config(format!(
            "rate limit {what}: {} calls a second is outside (0, 1000000]",
            limit.per_second
        )));
    }
    if !(limit.burst.is_finite() && (1.0..=1e6).contains(&limit.burst)) {
        return Err(Error::Config(format!(
            "rate limit {what}: a burst of {} is outside [1, 1000000]",
            limit.burst
        )));
    }
    Ok(())
}

/// A circuit breaker: after `failures` consecutive retryable failures (across relays) the
/// destination opens for a cool-down (`cool_down`, doubled at each opening in a row, at most
/// `max_cool_down`), then lets one probe through; a delivered probe closes it. Rows of an open
/// destination stay pending and spend no attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    /// Consecutive retryable failures that open the breaker (default 10).
    pub failures: u32,
    /// The first cool-down (default 5 s).
    pub cool_down: Duration,
    /// The longest cool-down (default 5 min).
    pub max_cool_down: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            failures: 10,
            cool_down: Duration::from_secs(5),
            max_cool_down: Duration::from_secs(300),
        }
    }
}

impl Breaker {
    /// The cool-down of the `opens`-th opening in a row (1 for the first).
    pub fn cool_down_after(&self, opens: u32) -> Duration {
        let doubled = self
            .cool_down
            .saturating_mul(2u32.saturating_pow(opens.saturating_sub(1).min(30)));
        doubled.min(self.max_cool_down)
    }
}

/// How the relay learns of new rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeMode {
    /// LISTEN for the write path's hint, and poll as a fallback.
    ListenAndPoll,
    /// Poll only (behind PgBouncer in transaction mode, where LISTEN does not work).
    PollOnly,
}

/// The relay's knobs. Every field has a default; see [`RelayConfig::default`].
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// This relay's name in leases and the attempt log (default: host, pid and a random suffix).
    pub owner: String,
    /// Rows claimed per claim statement (default 100).
    pub batch_size: usize,
    /// Deliveries in flight at once (default 64); a slow sink holds only its own slots.
    pub concurrency: usize,
    /// How long a claim is ours (default 30 s). Every sink call is cut off before the lease ends
    /// (see [`RelayConfig::call_limit`]), and a sink whose own timeout is longer is refused.
    pub lease: Duration,
    /// Fallback poll period when no hint arrives (default 1 s).
    pub poll_interval: Duration,
    /// LISTEN + poll, or poll only.
    pub wake: WakeMode,
    /// How often expired leases are taken back (default 1 s).
    pub reclaim_interval: Duration,
    /// At shutdown, how long in-flight deliveries may take to finish (default 10 s). The relay
    /// returns at most [`SHUTDOWN_FLUSH`] after it, whatever the database or the sinks do.
    pub shutdown_grace: Duration,
    /// Completions written per statement at most (default 256).
    pub completion_batch: usize,
    /// Connections in the relay's pool (default 4).
    pub pool_size: usize,
    /// Run the relay's statements as prepared statements cached per connection (default true).
    /// Turn off behind a connection pooler that cannot carry prepared statements (PgBouncer in
    /// transaction mode before 1.21): statements then go unnamed, one round trip each.
    pub prepared_statements: bool,
    /// How often the relay samples the backlog gauges (`txoutbox_pending_messages`,
    /// `txoutbox_oldest_pending_age_seconds`) with one index-only query (default 5 s; zero turns
    /// sampling off).
    pub sample_interval: Duration,
    /// How often the relay refreshes its row in `txoutbox_relays` (default 5 s): one small
    /// UPDATE. Three missed heartbeats mark it stale in `txoutbox relays` and the dashboard.
    pub heartbeat_interval: Duration,
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
            batch_size: 100,
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
            heartbeat_interval: Duration::from_secs(5),
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
            ("heartbeat_interval", self.heartbeat_interval),
        ] {
            if value.is_zero() {
                return config(setting, "must be above zero".into());
            }
        }
        Ok(())
    }
}

fn check_policy(destination: &str, policy: &DestinationPolicy) -> Result<()> {
    let retry = &policy.retry;
    let what = |field: &str| format!("the retry policy of {destination:?}: {field}");
    if retry.max_attempts == 0 {
        return Err(Error::Config(format!(
            "{}: must be at least 1",
            what("max_attempts")
        )));
    }
    if retry.cap < retry.base {
        return Err(Error::Config(format!(
            "{}: the cap ({:?}) is below the base ({:?})",
            what("cap"),
            retry.cap,
            retry.base
        )));
    }
    if retry.cap > MAX_RETRY_DELAY {
        return Err(Error::Config(format!(
            "{}: {:?} is above the longest delay, {:?}",
            what("cap"),
            retry.cap,
            MAX_RETRY_DELAY
        )));
    }
    let flow = &policy.flow;
    if let Some(limit) = &flow.rate_limit {
        check_rate(&format!("of {destination:?}"), limit)?;
    }
    if flow.max_in_flight == Some(0) {
        return Err(Error::Config(format!(
            "max_in_flight of {destination:?}: must be at least 1"
        )));
    }
    if let Some(breaker) = &flow.breaker {
        let why = if breaker.failures == 0 {
            Some("failures must be at least 1 (turn the breaker off with None)".to_owned())
        } else if breaker.cool_down.is_zero() {
            Some("the cool-down must be above zero".to_owned())
        } else if breaker.max_cool_down < breaker.cool_down {
            Some(format!(
                "the longest cool-down ({:?}) is below the first ({:?})",
                breaker.max_cool_down, breaker.cool_down
            ))
        } else if breaker.max_cool_down > MAX_RETRY_DELAY {
            Some(format!(
                "the longest cool-down ({:?}) is above {MAX_RETRY_DELAY:?}",
                breaker.max_cool_down
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::Config(format!(
                "the breaker of {destination:?}: {why}"
            )));
        }
    }
    Ok(())
}

/// Builds a [`Relay`]: register sinks, policies and hooks by destination.
pub struct RelayBuilder {
    pub(super) pg: PgConfig,
    pub(super) config: RelayConfig,
    pub(super) sinks: HashMap<String, Arc<dyn Sink>>,
    pub(super) hooks: HashMap<String, Arc<dyn CompletionHook>>,
    pub(super) policies: HashMap<String, DestinationPolicy>,
    pub(super) default_policy: DestinationPolicy,
}

impl RelayBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// Registers the sink that delivers `destination`'s rows.
    pub fn sink(mut self, destination: impl Into<String>, sink: impl Sink) -> Self {
        self.sinks.insert(destination.into(), Arc::new(sink));
        self
    }

    /// Registers an already shared sink.
    pub fn shared_sink(mut self, destination: impl Into<String>, sink: Arc<dyn Sink>) -> Self {
        self.sinks.insert(destination.into(), sink);
        self
    }

    /// Sets `destination`'s retry policy and semantics.
    pub fn policy(mut self, destination: impl Into<String>, policy: DestinationPolicy) -> Self {
        self.policies.insert(destination.into(), policy);
        self
    }

    /// Sets the policy of destinations without one of their own.
    pub fn default_policy(mut self, policy: DestinationPolicy) -> Self {
        self.default_policy = policy;
        self
    }

    /// Registers a hook run in the completion transaction of `destination`'s rows.
    pub fn hook(mut self, destination: impl Into<String>, hook: impl CompletionHook) -> Self {
        self.hooks.insert(destination.into(), Arc::new(hook));
        self
    }

    /// Builds the relay (and its connection pool; nothing connects until `run`). Fails with
    /// [`Error::Config`] for a configuration that cannot work: a sink whose timeout does not fit
    /// in [`RelayConfig::call_limit`], a retry cap below its base, a lease out of range.
    pub fn build(self) -> Result<Relay> {
        self.config.check()?;
        check_policy("(default)", &self.default_policy)?;
        for (destination, policy) in &self.policies {
            check_policy(destination, policy)?;
        }
        let limit = self.config.call_limit();
        let mut sinks: Vec<_> = self.sinks.iter().collect();
        sinks.sort_by(|a, b| a.0.cmp(b.0));
        for (destination, sink) in sinks {
            if let Some(timeout) = sink.timeout() {
                if timeout >= limit {
                    let needed = (timeout * 5 / 4).max(timeout + Duration::from_secs(2));
                    return Err(Error::Config(format!(
                        "lease: {:?} leaves {limit:?} for one call, but the sink of {destination:?} \
                         may take up to {timeout:?} (its timeout); another relay would deliver \
                         the row again while the call still runs. Raise the lease to at least \
                         {needed:?} or lower the sink's timeout",
                        self.config.lease
                    )));
                }
            }
        }
        // Custom plans: the claim's and completion's best plans depend on their array sizes and
        // on the hot table's size now, which a custom plan reads from the table itself while a
        // generic plan keeps what it saw when first built. Generic plans would save the
        // planning (about 0.6 of the claim's 0.9 ms at 1 000 msg/s), but a completion planned
        // generically on an empty table walked the whole due index for every row it could
        // unpark: 117 s for one batch of 100 once the table held 200 000 rows. No
        // JIT: the claim's estimated cost grows with the backlog (its bounded-destination branch
        // is costed for every destination the planner guesses), so past about 50 000 due rows it
        // crossed `jit_above_cost` and every claim spent some 80 ms compiling a plan that runs in
        // 4 ms. (Bitmap scans stay: a relay session without them drained 15-25 % slower, its
        // claims updating their rows in key order rather than heap order; the claim's plan over a
        // table without statistics is the relay's statistics check's to mend.) The relay sets
        // its own statement timeout, so a role's lower one cannot stop it claiming, and no
        // statement of the relay outlives a lease.
        let mut pg = self.pg.clone();
        let options = pg.config().get_options().unwrap_or("").to_owned();
        let statement_timeout = self.config.lease.max(Duration::from_secs(5)).as_millis();
        pg.config_mut().options(
            format!(
                "{options} -c plan_cache_mode=force_custom_plan -c jit=off \
                 -c statement_timeout={statement_timeout}"
            )
            .trim(),
        );
        let manager = pg.manager(deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        });
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(self.config.pool_size.max(2))
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Config(format!("relay pool: {e}")))?;
        Ok(Relay {
            inner: Arc::new(Inner {
                pg: self.pg,
                pool,
                config: self.config,
                sinks: self.sinks,
                hooks: self.hooks,
                policies: self.policies,
                default_policy: self.default_policy,
                wake: Arc::new(Notify::new()),
                listener_connected: Arc::new(AtomicBool::new(false)),
                flow_seen: AtomicBool::new(true),
                flow: super::flow::Flow::default(),
                poisoned: super::fan_out::Poisoned::default(),
                presence: super::presence::Presence::default(),
            }),
        })
    }
}
