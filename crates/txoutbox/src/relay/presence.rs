//! The relay's own row in `txoutbox_relays`, so operators see which relays are alive: recorded
//! at start (who, where, its sinks and bounds), refreshed every `heartbeat_interval` with one
//! small UPDATE (its last claim, the rows it holds; the answer is the relays alive, the
//! [`RELAYS_ALIVE`](crate::telemetry::RELAYS_ALIVE) gauge), and deleted at a clean exit. Rows
//! of relays silent for a day are pruned here, about once an hour.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::held::Held;
use super::{Inner, Semantics};
use crate::error::Result;
use crate::store::{self, Pooled};

/// How often a relay prunes the rows of relays silent for a day.
const PRUNE_EVERY: Duration = Duration::from_secs(60 * 60);

/// How long a clean exit waits for the heartbeat to finish its beat and delete the row; a row
/// left behind goes stale, then is pruned.
const REMOVE_WAIT: Duration = Duration::from_secs(2);

/// What the heartbeat reports besides being alive.
#[derive(Default)]
pub(super) struct Presence {
    /// The database time of the last claim that took rows, in microseconds (0: none yet).
    last_claim: AtomicI64,
}

impl Presence {
    /// Notes a claim that took rows at `at` (the claim's `now()`).
    pub(super) fn claimed(&self, at: DateTime<Utc>) {
        self.last_claim
            .fetch_max(at.timestamp_micros(), Ordering::Relaxed);
    }

    fn last_claim(&self) -> Option<DateTime<Utc>> {
        match self.last_claim.load(Ordering::Relaxed) {
            0 => None,
            micros => DateTime::from_timestamp_micros(micros),
        }
    }
}

/// The running heartbeat: its task owns the relay's row from the first beat to the delete, so
/// the delete can never overtake a beat still on its way (a row recorded after its own delete
/// would stay behind, stale).
pub(super) struct Heartbeat {
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts beating: the first beat records the relay.
    pub(super) fn start(inner: Arc<Inner>, held: Held) -> Self {
        let stop = Arc::new(Notify::new());
        let task = tokio::spawn(heartbeat(inner, held, stop.clone()));
        Self { stop, task }
    }

    /// Ends the heartbeat at a clean exit: the beat under way finishes, then the row is deleted
    /// (all within [`REMOVE_WAIT`]; past it the row is left to go stale).
    pub(super) async fn stop(mut self) {
        // A stored permit: the task sees it even when it is in the middle of a beat.
        self.stop.notify_one();
        if tokio::time::timeout(REMOVE_WAIT, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!(
                "deleting this relay's row in txoutbox_relays timed out; it will show as stale"
            );
        }
    }
}

/// A relay dropped mid-run (its task aborted, as a killed process) stops beating and writes
/// nothing more.
impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Beats every `heartbeat_interval` until `stop` is notified, then deletes the relay's row.
/// A failed beat is logged and tried again at the next one (the row goes stale meanwhile).
async fn heartbeat(inner: Arc<Inner>, held: Held, stop: Arc<Notify>) {
    let mut registered = false;
    let mut pruned: Option<Instant> = None;
    loop {
        match beat(&inner, &held, &mut registered).await {
            Ok(alive) => metrics::gauge!(crate::telemetry::RELAYS_ALIVE).set(alive as f64),
            Err(e) => tracing::debug!(error = %e, "relay heartbeat failed; will try again"),
        }
        if pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            match prune(&inner).await {
                Ok(()) => pruned = Some(Instant::now()),
                Err(e) => tracing::debug!(error = %e, "pruning silent relays failed"),
            }
        }
        tokio::select! {
            _ = stop.notified() => break,
            _ = tokio::time::sleep(inner.config.heartbeat_interval) => {}
        }
    }
    if let Err(e) = remove(&inner).await {
        tracing::warn!(error = %e, "could not delete this relay's row in txoutbox_relays; it will show as stale");
    }
}

/// One heartbeat (recording the relay first when it is not, or no longer, recorded): the
/// relays alive.
async fn beat(inner: &Inner, held: &Held, registered: &mut bool) -> Result<i64> {
    let client = inner.pool.get().await?;
    let conn = Pooled::new(&client, inner.config.prepared_statements);
    let owner = inner.config.owner.as_str();
    let holding = i32::try_from(held.len()).unwrap_or(i32::MAX);
    let last_claim = inner.presence.last_claim();
    if *registered {
        if let Some(alive) = store::relays::heartbeat(&conn, owner, last_claim, holding).await? {
            return Ok(alive);
        }
        tracing::info!(
            owner,
            "this relay's row in txoutbox_relays was gone; recording it again"
        );
    }
    let mut sinks: Vec<&str> = inner.sinks.keys().map(String::as_str).collect();
    sinks.sort_unstable();
    let host = super::config::host_name();
    let flow = bounds(inner);
    let registration = store::relays::Registration {
        owner,
        host: &host,
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        version: env!("CARGO_PKG_VERSION"),
        heartbeat_secs: inner.config.heartbeat_interval.as_secs_f64(),
        last_claim,
        held: holding,
        sinks: &sinks,
        flow: &flow,
    };
    store::relays::register(&Pooled::unnamed(&client), &registration).await?;
    *registered = true;
    Ok(store::relays::heartbeat(&conn, owner, last_claim, holding)
        .await?
        .unwrap_or(1))
}

/// The relay's flow bounds as recorded: its concurrency and batch size, and each destination it
/// bounds (a rate limit, an in-flight limit, at-most-once semantics).
fn bounds(inner: &Inner) -> Value {
    let mut destinations = Map::new();
    for destination in inner.sinks.keys() {
        let policy = inner.policy(destination);
        let mut bound = Map::new();
        if let Some(rate) = policy.flow.rate_limit {
            bound.insert("rate_per_sec".into(), json!(rate.per_second));
            bound.insert("burst".into(), json!(rate.burst));
        }
        if let Some(n) = policy.flow.max_in_flight {
            bound.insert("max_in_flight".into(), json!(n));
        }
        if policy.semantics == Semantics::AtMostOnce {
            bound.insert("at_most_once".into(), json!(true));
        }
        if !bound.is_empty() {
            destinations.insert(destination.clone(), Value::Object(bound));
        }
    }
    json!({
        "concurrency": inner.config.concurrency,
        "batch_size": inner.config.batch_size,
        "destinations": destinations,
    })
}

async fn prune(inner: &Inner) -> Result<()> {
    let client = inner.pool.get().await?;
    store::relays::prune(&Pooled::unnamed(&client)).await?;
    Ok(())
}

/// Deletes this relay's row.
async fn remove(inner: &Inner) -> Result<()> {
    let client = inner.pool.get().await?;
    store::relays::remove(&Pooled::unnamed(&client), &inner.config.owner).await?;
    Ok(())
}
