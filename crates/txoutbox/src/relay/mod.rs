//! The relay: claims committed outbox rows under a lease, hands them to their sinks, and records
//! the outcome, fenced by the lease token. Many relays (threads, processes, machines) may run at
//! once against one database; row locks coordinate them.
//!
//! Delivered rows are moved to `txoutbox_delivered` by the completion statement, so the hot table
//! holds only work in progress and its partial index stays small whatever the history.

mod backoff;
mod listener;
mod sql;

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_postgres::types::Type;
use tokio_postgres::{Config, NoTls, Row};
use uuid::Uuid;

pub use backoff::RetryPolicy;

use crate::sink::{Completion, CompletionHook, Delivery, DeliveryError, Receipt, Sink};
use crate::{Error, Result};

/// What a destination's downstream can do with a redelivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Semantics {
    /// The downstream deduplicates on the forwarded key: a row whose attempt was cut short is
    /// delivered again, with the same key (the default).
    #[default]
    AtLeastOnce,
    /// The downstream cannot deduplicate: the attempt's start is committed before the call, and
    /// a row whose lease expired mid-attempt goes to `unknown` for an operator to decide.
    AtMostOnce,
}

/// Per-destination delivery rules.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DestinationPolicy {
    /// Backoff and attempt limit.
    pub retry: RetryPolicy,
    /// At-least-once or at-most-once.
    pub semantics: Semantics,
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
    /// How long a claim is ours (default 30 s). Must exceed the slowest sink's timeout.
    pub lease: Duration,
    /// Fallback poll period when no hint arrives (default 1 s).
    pub poll_interval: Duration,
    /// LISTEN + poll, or poll only.
    pub wake: WakeMode,
    /// How often expired leases are taken back (default 1 s).
    pub reclaim_interval: Duration,
    /// At shutdown, how long in-flight deliveries may take to finish (default 10 s).
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
}

impl Default for RelayConfig {
    fn default() -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "relay".to_owned());
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
        }
    }
}

/// Builds a [`Relay`]: register sinks, policies and hooks by destination.
pub struct RelayBuilder {
    pg: Config,
    config: RelayConfig,
    sinks: HashMap<String, Arc<dyn Sink>>,
    hooks: HashMap<String, Arc<dyn CompletionHook>>,
    policies: HashMap<String, DestinationPolicy>,
    default_policy: DestinationPolicy,
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

    /// Builds the relay (and its connection pool; nothing connects until `run`).
    pub fn build(self) -> Result<Relay> {
        // Custom plans: the claim's and completion's best plans depend on their array sizes.
        let mut pg = self.pg.clone();
        let options = pg.get_options().unwrap_or("").to_owned();
        pg.options(format!("{options} -c plan_cache_mode=force_custom_plan").trim());
        let manager = deadpool_postgres::Manager::from_config(
            pg,
            NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(self.config.pool_size.max(2))
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Invalid(format!("relay pool: {e}")))?;
        let at_most_once = self
            .policies
            .iter()
            .filter(|(_, p)| p.semantics == Semantics::AtMostOnce)
            .map(|(d, _)| d.clone())
            .collect();
        Ok(Relay {
            inner: Arc::new(Inner {
                pg: self.pg,
                pool,
                config: self.config,
                sinks: self.sinks,
                hooks: self.hooks,
                policies: self.policies,
                default_policy: self.default_policy,
                at_most_once,
                wake: Arc::new(Notify::new()),
                listener_connected: Arc::new(AtomicBool::new(false)),
            }),
        })
    }
}

/// The relay engine. `run` it in its own process (`txoutbox relay`) or inside a service.
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

struct Inner {
    pg: Config,
    pool: deadpool_postgres::Pool,
    config: RelayConfig,
    sinks: HashMap<String, Arc<dyn Sink>>,
    hooks: HashMap<String, Arc<dyn CompletionHook>>,
    policies: HashMap<String, DestinationPolicy>,
    default_policy: DestinationPolicy,
    at_most_once: Vec<String>,
    wake: Arc<Notify>,
    listener_connected: Arc<AtomicBool>,
}

/// What a relay did between `run` and its return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Rows claimed.
    pub claimed: u64,
    /// Rows given back at shutdown (not finished within the grace period).
    pub released: u64,
}

/// A claimed row, with what its completion needs.
#[derive(Debug, Clone)]
struct Claimed {
    delivery: Delivery,
    token: i64,
    /// The attempt's start, by the database's clock (the claim's `now()`).
    started: DateTime<Utc>,
    /// When the claim's rows arrived, by this process's monotonic clock.
    claimed_at: std::time::Instant,
}

impl Claimed {
    /// Now, by the database's clock: the claim's time plus the time elapsed here since. Every
    /// time the relay records (attempt end, delivery, latency) is on the clock `created_at` and
    /// `started_at` come from, so a relay machine whose clock is off records no negative or
    /// inflated durations.
    fn now(&self) -> DateTime<Utc> {
        let elapsed = chrono::Duration::from_std(self.claimed_at.elapsed()).unwrap_or_default();
        self.started + elapsed
    }
}

/// The outcome of one attempt, waiting to be written.
#[derive(Debug)]
struct Finished {
    claimed: Claimed,
    kind: &'static str,
    error: Option<String>,
    receipt: Option<String>,
    delay: Duration,
    finished: DateTime<Utc>,
    completion: Option<Completion>,
}

type InFlight = Arc<Mutex<HashMap<Uuid, Claimed>>>;

impl Relay {
    /// Starts building a relay over the database `pg` points to.
    pub fn builder(pg: Config) -> RelayBuilder {
        RelayBuilder {
            pg,
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
    /// within the grace period, gives back the leases of the rest, writes every outcome, and
    /// returns. Database outages are waited out (the pool reconnects); they never end the run.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<RelayReport> {
        let inner = self.inner.clone();
        let config = &inner.config;
        let stop = Arc::new(Notify::new());
        let mut background = JoinSet::new();
        if config.wake == WakeMode::ListenAndPoll {
            background.spawn(listener::listen(
                inner.pg.clone(),
                inner.wake.clone(),
                inner.listener_connected.clone(),
                stop.clone(),
            ));
        }
        background.spawn(reclaimer(inner.clone(), stop.clone()));
        if !config.sample_interval.is_zero() {
            background.spawn(sampler(inner.clone(), stop.clone()));
        }
        let (done, results) = mpsc::channel::<Finished>(config.concurrency.max(1) * 2);
        let shutting_down = Arc::new(AtomicBool::new(false));
        let completer = tokio::spawn(completer(inner.clone(), results, shutting_down.clone()));

        let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
        let in_flight: InFlight = Arc::new(Mutex::new(HashMap::new()));
        let mut deliveries = JoinSet::new();
        let mut report = RelayReport::default();
        let mut failures = 0u32;
        tokio::pin!(shutdown);
        loop {
            while deliveries.try_join_next().is_some() {}
            let free = slots.available_permits();
            if free == 0 {
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    permit = slots.acquire() => { drop(permit); continue; }
                }
            }
            let want = free.min(config.batch_size.max(1));
            let claimed = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                claimed = claim(&inner, want) => claimed,
            };
            let rows = match claimed {
                Ok(rows) => {
                    failures = 0;
                    rows
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "claim failed; retrying");
                    let pause = Duration::from_millis(50 * 2u64.pow(failures.min(6)))
                        .min(config.poll_interval.max(Duration::from_millis(100)));
                    tokio::select! {
                        biased;
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(pause) => continue,
                    }
                }
            };
            let full = rows.len() == want;
            report.claimed += rows.len() as u64;
            for claimed in rows {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    // Cannot happen (only this loop takes slots); give the row back rather than lose it.
                    let _ = done.send(given_back(&inner, claimed, "unstarted")).await;
                    continue;
                };
                in_flight
                    .lock()
                    .map(|mut m| m.insert(claimed.delivery.id, claimed.clone()))
                    .ok();
                let (inner, done, in_flight) = (inner.clone(), done.clone(), in_flight.clone());
                deliveries.spawn(async move {
                    let id = claimed.delivery.id;
                    let finished = deliver(&inner, claimed).await;
                    // Forget the row only once its outcome is queued: a row is always either in
                    // flight here or queued for completion.
                    let _ = done.send(finished).await;
                    in_flight.lock().map(|mut m| m.remove(&id)).ok();
                    drop(permit);
                });
            }
            if full {
                continue; // a backlog: claim again at once
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                _ = inner.wake.notified() => {}
                _ = tokio::time::sleep(config.poll_interval) => {}
            }
        }

        // Shutdown: no more claims; let deliveries finish within the grace period.
        tracing::info!(owner = %config.owner, in_flight = deliveries.len(), "relay stopping");
        let drained = tokio::time::timeout(config.shutdown_grace, async {
            while deliveries.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            deliveries.abort_all();
            while deliveries.join_next().await.is_some() {}
        }
        let left: Vec<Claimed> = in_flight
            .lock()
            .map(|mut m| m.drain().map(|(_, c)| c).collect())
            .unwrap_or_default();
        for claimed in left {
            report.released += 1;
            let _ = done.send(given_back(&inner, claimed, "released")).await;
        }
        shutting_down.store(true, Ordering::Relaxed);
        drop(done);
        let _ = completer.await;
        stop.notify_waiters();
        background.abort_all();
        while background.join_next().await.is_some() {}
        tracing::info!(owner = %config.owner, claimed = report.claimed, released = report.released, "relay stopped");
        Ok(report)
    }
}

impl Inner {
    fn policy(&self, destination: &str) -> &DestinationPolicy {
        self.policies
            .get(destination)
            .unwrap_or(&self.default_policy)
    }
}

/// An outcome for a row whose attempt was cut short (or never began) at shutdown.
fn given_back(inner: &Inner, claimed: Claimed, kind: &'static str) -> Finished {
    let at_most_once =
        inner.policy(&claimed.delivery.destination).semantics == Semantics::AtMostOnce;
    let (kind, error) = match kind {
        "released" if at_most_once => (
            "unknown",
            Some("the relay stopped during an at-most-once attempt: it may or may not have reached the downstream".to_owned()),
        ),
        "released" => ("released", Some("the relay stopped during the attempt".to_owned())),
        other => (other, None),
    };
    Finished {
        finished: claimed.now(),
        claimed,
        kind,
        error,
        receipt: None,
        delay: Duration::ZERO,
        completion: None,
    }
}

/// The relay's connections: a pooled client, or a transaction on one.
trait Connection: Sync {
    async fn run(
        &self,
        prepared: bool,
        sql: &'static str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error>;
}

macro_rules! impl_connection {
    ($t:ty) => {
        impl Connection for $t {
            async fn run(
                &self,
                prepared: bool,
                sql: &'static str,
                params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
            ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
                if !prepared {
                    return self.query_typed(sql, params).await;
                }
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let statement = self.prepare_typed_cached(sql, &types).await?;
                let values: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    params.iter().map(|(v, _)| *v).collect();
                self.query(&statement, &values).await
            }
        }
    };
}
impl_connection!(deadpool_postgres::Object);
impl_connection!(deadpool_postgres::Transaction<'_>);

async fn claim(inner: &Inner, want: usize) -> Result<Vec<Claimed>> {
    let client = inner.pool.get().await?;
    let limit = want as i64;
    let lease = inner.config.lease.as_secs_f64();
    let rows = client
        .run(
            inner.config.prepared_statements,
            sql::CLAIM,
            &[
                (&limit, Type::INT8),
                (&inner.config.owner, Type::TEXT),
                (&lease, Type::FLOAT8),
                (&inner.at_most_once, Type::TEXT_ARRAY),
            ],
        )
        .await?;
    rows.iter().map(claimed_from_row).collect()
}

fn claimed_from_row(row: &Row) -> Result<Claimed> {
    let headers: serde_json::Value = row.try_get(3)?;
    let attempts: i32 = row.try_get(6)?;
    Ok(Claimed {
        delivery: Delivery {
            id: row.try_get(0)?,
            destination: row.try_get(1)?,
            payload: row.try_get(2)?,
            headers: serde_json::from_value(headers).unwrap_or_default(),
            downstream_key: row.try_get(4)?,
            ordering_key: row.try_get(5)?,
            attempt: u32::try_from(attempts).unwrap_or(0),
            created_at: row.try_get(8)?,
        },
        token: row.try_get(7)?,
        started: row.try_get(9)?,
        claimed_at: std::time::Instant::now(),
    })
}

/// Runs one attempt and classifies it. Never panics: a panicking sink is a retryable failure.
async fn deliver(inner: &Inner, mut claimed: Claimed) -> Finished {
    let span = tracing::info_span!(
        "delivery",
        message_id = %claimed.delivery.id,
        destination = %claimed.delivery.destination,
        attempt = claimed.delivery.attempt,
        downstream_key = %claimed.delivery.downstream_key,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        parent_span_id = tracing::field::Empty,
    );
    // The attempt is a span of its own in the trace stored at enqueue, and the sink forwards its
    // context (the stored row keeps the enqueue-time header).
    if let Some(parent) = crate::telemetry::traceparent(&claimed.delivery.headers) {
        span.record("parent_span_id", parent.parent_id());
    }
    if let Some(context) = crate::telemetry::attempt_context(&span, &claimed.delivery.headers) {
        span.record("trace_id", context.trace_id());
        span.record("span_id", context.parent_id());
        crate::telemetry::set_traceparent(&mut claimed.delivery.headers, &context);
    }
    let delivery = &claimed.delivery;
    let policy = inner.policy(&delivery.destination);
    let mut sink_started = None;
    let result = if delivery.attempt > policy.retry.max_attempts {
        Err(DeliveryError::permanent(format!(
            "{} attempts made (the last one's lease expired); the limit is {}",
            delivery.attempt - 1,
            policy.retry.max_attempts
        )))
    } else {
        match inner.sinks.get(&delivery.destination) {
            None => Err(DeliveryError::permanent(format!(
                "no sink is registered for destination {:?} on relay {}",
                delivery.destination, inner.config.owner
            ))),
            Some(sink) => {
                sink_started = Some(std::time::Instant::now());
                let call = AssertUnwindSafe(sink.deliver(delivery)).catch_unwind();
                match tracing::Instrument::instrument(call, span.clone()).await {
                    Ok(result) => result,
                    Err(panic) => Err(DeliveryError::retryable(format!(
                        "the sink panicked: {}",
                        panic_text(&*panic)
                    ))),
                }
            }
        }
    };
    let finished = claimed.now();
    let mut out = Finished {
        claimed: claimed.clone(),
        kind: "delivered",
        error: None,
        receipt: None,
        delay: Duration::ZERO,
        finished,
        completion: None,
    };
    let _enter = span.enter();
    match result {
        Ok(Receipt(receipt)) => {
            tracing::debug!("delivered");
            out.receipt = receipt.clone();
            out.completion = Some(Completion::Delivered(Receipt(receipt)));
        }
        Err(DeliveryError::Retryable {
            message,
            retry_after,
        }) if claimed.delivery.attempt < policy.retry.max_attempts => {
            out.kind = "retry";
            out.delay = policy.retry.delay(claimed.delivery.attempt, retry_after);
            tracing::info!(error = %message, retry_in = ?out.delay, "delivery failed; will retry");
            out.error = Some(message);
        }
        Err(DeliveryError::Retryable { message, .. }) => {
            let message = format!(
                "gave up after {} attempts: {message}",
                claimed.delivery.attempt
            );
            tracing::warn!(error = %message, "dead-lettered");
            out.kind = "failed";
            out.completion = Some(Completion::DeadLettered(message.clone()));
            out.error = Some(message);
        }
        Err(DeliveryError::Indeterminate { message }) => {
            // Until the at-most-once mapping: retried like any retryable failure.
            out.kind = "retry";
            out.delay = policy.retry.delay(claimed.delivery.attempt, None);
            out.error = Some(message);
        }
        Err(DeliveryError::Permanent { message }) => {
            tracing::warn!(error = %message, "permanent failure; dead-lettered");
            out.kind = "failed";
            out.completion = Some(Completion::DeadLettered(message.clone()));
            out.error = Some(message);
        }
    }
    if let Some(started) = sink_started {
        let outcome = match out.kind {
            "delivered" => "delivered",
            "retry" => "retry",
            _ => "failed",
        };
        metrics::histogram!(
            crate::telemetry::ATTEMPT_DURATION,
            "destination" => delivery.destination.clone(),
            "outcome" => outcome,
        )
        .record(started.elapsed().as_secs_f64());
    }
    out
}

/// Counts the outcomes whose completion took effect (`applied`): a completion fenced out by a
/// lost lease is not a delivery of this relay's.
fn record_outcomes<'a>(applied: &[Uuid], finished: impl Iterator<Item = &'a Finished>) {
    use crate::telemetry::{DEAD_LETTERED, DELIVERED, DELIVERY_LATENCY, RETRIED};
    for f in finished.filter(|f| applied.contains(&f.claimed.delivery.id)) {
        let destination = f.claimed.delivery.destination.clone();
        match f.kind {
            "delivered" => {
                let latency = (f.finished - f.claimed.delivery.created_at)
                    .to_std()
                    .unwrap_or_default();
                metrics::histogram!(DELIVERY_LATENCY, "destination" => destination.clone())
                    .record(latency.as_secs_f64());
                metrics::counter!(DELIVERED, "destination" => destination).increment(1);
            }
            "retry" => metrics::counter!(RETRIED, "destination" => destination).increment(1),
            "failed" => metrics::counter!(DEAD_LETTERED, "destination" => destination).increment(1),
            _ => {}
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// Writes outcomes in batches; rows of destinations with a hook one by one, with their hook, in
/// one transaction each. Retries a failed write until it succeeds (the rows stay leased
/// meanwhile) or, after shutdown, gives up after a few tries: the leases then expire and the rows
/// are delivered again with the same key.
async fn completer(
    inner: Arc<Inner>,
    mut results: mpsc::Receiver<Finished>,
    shutting_down: Arc<AtomicBool>,
) {
    let max = inner.config.completion_batch.max(1);
    let writers = Arc::new(Semaphore::new(COMPLETION_WRITERS));
    let mut writes = JoinSet::new();
    while let Some(first) = results.recv().await {
        let mut batch = vec![first];
        while batch.len() < max {
            match results.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        let (hooked, plain): (Vec<_>, Vec<_>) = batch.into_iter().partition(|f| {
            f.completion.is_some() && inner.hooks.contains_key(&f.claimed.delivery.destination)
        });
        if !plain.is_empty() {
            // Batches touch disjoint rows: write up to COMPLETION_WRITERS of them at once.
            let Ok(permit) = writers.clone().acquire_owned().await else {
                return;
            };
            let (inner, shutting_down) = (inner.clone(), shutting_down.clone());
            writes.spawn(async move {
                write_with_retries(&shutting_down, || complete_plain(&inner, &plain)).await;
                drop(permit);
            });
            while writes.try_join_next().is_some() {}
        }
        for finished in &hooked {
            write_with_retries(&shutting_down, || complete_hooked(&inner, finished)).await;
        }
    }
    while writes.join_next().await.is_some() {}
}

/// Completion statements in flight at once (each on its own pooled connection).
const COMPLETION_WRITERS: usize = 2;

async fn write_with_retries<F, Fut>(shutting_down: &AtomicBool, mut write: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut tries = 0u32;
    loop {
        match write().await {
            Ok(()) => return,
            Err(e) => {
                tries += 1;
                if shutting_down.load(Ordering::Relaxed) && tries >= 5 {
                    tracing::error!(error = %e, "completion not written; the leases will expire and the rows be delivered again");
                    return;
                }
                tracing::warn!(error = %e, tries, "completion not written yet; retrying");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(tries.min(20)))).await;
            }
        }
    }
}

async fn complete_plain(inner: &Inner, batch: &[Finished]) -> Result<()> {
    let client = inner.pool.get().await?;
    let applied = run_complete(&client, inner, batch).await?;
    record_outcomes(&applied, batch.iter());
    Ok(())
}

async fn complete_hooked(inner: &Inner, finished: &Finished) -> Result<()> {
    let mut client = inner.pool.get().await?;
    let tx = client.transaction().await?;
    let applied = run_complete(&tx, inner, std::slice::from_ref(finished)).await?;
    if let (Some(hook), Some(completion), true) = (
        inner.hooks.get(&finished.claimed.delivery.destination),
        &finished.completion,
        !applied.is_empty(),
    ) {
        if let Err(e) = hook
            .completed(&tx, &finished.claimed.delivery, completion)
            .await
        {
            // Roll back the completion too: the row is delivered again once its lease expires.
            tracing::error!(error = %e, message_id = %finished.claimed.delivery.id, "completion hook failed; the row will be delivered again");
            return Ok(());
        }
    }
    tx.commit().await?;
    record_outcomes(&applied, std::iter::once(finished));
    Ok(())
}

async fn run_complete(
    client: &impl Connection,
    inner: &Inner,
    batch: &[Finished],
) -> Result<Vec<Uuid>> {
    let ids: Vec<Uuid> = batch.iter().map(|f| f.claimed.delivery.id).collect();
    let tokens: Vec<i64> = batch.iter().map(|f| f.claimed.token).collect();
    let kinds: Vec<&str> = batch.iter().map(|f| f.kind).collect();
    let errors: Vec<Option<&str>> = batch.iter().map(|f| f.error.as_deref()).collect();
    let receipts: Vec<Option<&str>> = batch.iter().map(|f| f.receipt.as_deref()).collect();
    let delays: Vec<f64> = batch.iter().map(|f| f.delay.as_secs_f64()).collect();
    let started: Vec<DateTime<Utc>> = batch.iter().map(|f| f.claimed.started).collect();
    let finished: Vec<DateTime<Utc>> = batch.iter().map(|f| f.finished).collect();
    let attempts: Vec<i32> = batch
        .iter()
        .map(|f| i32::try_from(f.claimed.delivery.attempt).unwrap_or(i32::MAX))
        .collect();
    let keys: Vec<&str> = batch
        .iter()
        .map(|f| f.claimed.delivery.downstream_key.as_str())
        .collect();
    let rows = client
        .run(
            inner.config.prepared_statements,
            sql::COMPLETE,
            &[
                (&ids, Type::UUID_ARRAY),
                (&tokens, Type::INT8_ARRAY),
                (&kinds, Type::TEXT_ARRAY),
                (&errors, Type::TEXT_ARRAY),
                (&receipts, Type::TEXT_ARRAY),
                (&delays, Type::FLOAT8_ARRAY),
                (&started, Type::TIMESTAMPTZ_ARRAY),
                (&finished, Type::TIMESTAMPTZ_ARRAY),
                (&attempts, Type::INT4_ARRAY),
                (&keys, Type::TEXT_ARRAY),
                (&inner.config.owner, Type::TEXT),
            ],
        )
        .await?;
    rows.iter()
        .map(|r| r.try_get(0).map_err(Error::from))
        .collect()
}

/// Takes back expired leases every `reclaim_interval`, and wakes the claimer when it did.
async fn reclaimer(inner: Arc<Inner>, stop: Arc<Notify>) {
    loop {
        tokio::select! {
            _ = stop.notified() => return,
            _ = tokio::time::sleep(inner.config.reclaim_interval) => {}
        }
        match reclaim_expired(&inner.pool).await {
            Ok(0) => {}
            Ok(n) => {
                metrics::counter!(crate::telemetry::LEASES_RECLAIMED).increment(n);
                tracing::info!(rows = n, "took back rows whose lease expired");
                inner.wake.notify_one();
            }
            Err(e) => tracing::debug!(error = %e, "lease reclaim failed; will try again"),
        }
    }
}

/// Samples the backlog gauges every `sample_interval`.
async fn sampler(inner: Arc<Inner>, stop: Arc<Notify>) {
    loop {
        match sample_backlog(&inner.pool).await {
            Ok((pending, oldest)) => {
                metrics::gauge!(crate::telemetry::PENDING).set(pending as f64);
                metrics::gauge!(crate::telemetry::OLDEST_PENDING_AGE).set(oldest);
            }
            Err(e) => tracing::debug!(error = %e, "backlog sample failed; will try again"),
        }
        tokio::select! {
            _ = stop.notified() => return,
            _ = tokio::time::sleep(inner.config.sample_interval) => {}
        }
    }
}

async fn sample_backlog(pool: &deadpool_postgres::Pool) -> Result<(i64, f64)> {
    let client = pool.get().await?;
    let row = client.query_typed(sql::SAMPLE_BACKLOG, &[]).await?;
    let row = row
        .first()
        .ok_or_else(|| Error::Invalid("the backlog sample returned no row".into()))?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// Takes back every row whose lease has expired; returns how many. Run by every relay
/// periodically; exposed for operators and tests.
pub async fn reclaim_expired(pool: &deadpool_postgres::Pool) -> Result<u64> {
    let client = pool.get().await?;
    let mut total = 0;
    loop {
        let limit = 1000i64;
        let row = client
            .query_typed(sql::RECLAIM_EXPIRED, &[(&limit, Type::INT8)])
            .await?;
        let moved: i64 = row.first().map(|r| r.get(0)).unwrap_or(0);
        total += moved as u64;
        if moved < limit {
            return Ok(total);
        }
    }
}
