//! The relay's builder: sinks, hooks and policies by destination, and the checks that refuse a
//! configuration that cannot work before anything connects.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::policy::check_policy;
use super::{DestinationPolicy, RelayConfig};
use crate::error::{Error, Result};
use crate::pg::PgConfig;
use crate::relay::claim_loop::CLAIMS_IN_FLIGHT;
use crate::relay::{Inner, Relay};
use crate::sink::{CompletionHook, Sink};

/// Builds a [`Relay`]: register sinks, policies and hooks by destination.
pub struct RelayBuilder {
    pub(in crate::relay) pg: PgConfig,
    pub(in crate::relay) config: RelayConfig,
    pub(in crate::relay) sinks: HashMap<String, Arc<dyn Sink>>,
    pub(in crate::relay) hooks: HashMap<String, Arc<dyn CompletionHook>>,
    pub(in crate::relay) policies: HashMap<String, DestinationPolicy>,
    pub(in crate::relay) default_policy: DestinationPolicy,
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
        let statement_timeout = self.config.lease.max(Duration::from_secs(5)).as_millis();
        let pool = session_pool(
            &self.pg,
            &format!("{RELAY_SESSION} -c statement_timeout={statement_timeout}"),
            self.config.pool_size.max(2),
        )?;
        let claim_pool = session_pool(
            &self.pg,
            &format!("{CLAIM_SESSION} -c statement_timeout={statement_timeout}"),
            CLAIMS_IN_FLIGHT,
        )?;
        Ok(Relay {
            inner: Arc::new(Inner {
                pg: self.pg,
                pool,
                claim_pool,
                config: self.config,
                sinks: self.sinks,
                hooks: self.hooks,
                policies: self.policies,
                default_policy: self.default_policy,
                wake: Arc::new(Notify::new()),
                listener_connected: Arc::new(AtomicBool::new(false)),
                flow_seen: AtomicBool::new(true),
                flow: crate::relay::flow::Flow::default(),
                poisoned: crate::relay::fan_out::Poisoned::default(),
                presence: crate::relay::presence::Presence::default(),
            }),
        })
    }
}

/// The settings of the relay's sessions but those of [`CLAIM_SESSION`]. Custom plans: the
/// completion's best plans depend on its array sizes and on the hot table's size now, which a
/// custom plan reads from the table itself while a generic plan keeps what it saw when first built:
/// a completion planned generically on an empty table walked the whole due index for every row it
/// could unpark, 117 s for one batch of 100 once the table held 200 000 rows. No JIT: the claim's
/// estimated cost grows with the backlog (its bounded-destination branch is costed for every
/// destination the planner guesses), so past about 50 000 due rows it crossed `jit_above_cost` and
/// every claim spent some 80 ms compiling a plan that runs in 4 ms. (Bitmap scans stay: a relay
/// session without them drained 15-25 % slower, its claims updating their rows in key order rather
/// than heap order; a custom plan over a table without statistics is the relay's statistics check's
/// to mend.) The relay sets its own statement timeout, so a role's lower one cannot stop it
/// claiming, and no statement of the relay outlives a lease.
const RELAY_SESSION: &str = "-c plan_cache_mode=force_custom_plan -c jit=off";

/// The settings of the sessions that send the claim of a relay that bounds no destination
/// (`messages/claim_unbounded.sql`): one generic plan, built once a session and again after
/// each ANALYZE of the table, where a custom plan would be planned at every claim (about 1 of
/// a small claim's 1.5 ms, the most of an idle relay's commit-to-sink time). No sequential scan
/// and no sort of the table, so that even a plan built over a table analyzed empty reads every
/// row through an index (the due index in due order, the ordering index, the primary key): a
/// plan that cannot go wrong whatever the statistics say, where a custom plan over the same
/// stale statistics scans the whole table at every claim.
pub(crate) const CLAIM_SESSION: &str =
    "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c enable_sort=off -c jit=off";

/// A pool of sessions opened with `settings` after the caller's own options.
fn session_pool(pg: &PgConfig, settings: &str, size: usize) -> Result<deadpool_postgres::Pool> {
    let mut pg = pg.clone();
    let options = pg.config().get_options().unwrap_or("").to_owned();
    pg.config_mut()
        .options(format!("{options} {settings}").trim());
    pg.pool_builder(size)
        .wait_timeout(Some(Duration::from_secs(10)))
        .build()
        .map_err(|e| Error::Config(format!("relay pool: {e}")))
}
