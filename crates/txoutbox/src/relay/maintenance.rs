//! The relay's background work beside the claim loop: the LISTEN task, taking back expired
//! leases, making due the waiting rows left with nothing ahead, sampling the backlog gauges, and
//! gathering the hot table's statistics while it has none. Each runs until `stop` is notified.

use std::sync::Arc;
use std::time::Duration;

use super::{listener, Inner, WakeMode};
use crate::error::{Error, Result};
use crate::store::{self, Pooled};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// Starts the background tasks of a running relay.
pub(super) fn spawn(inner: &Arc<Inner>, stop: &Arc<Notify>) -> JoinSet<()> {
    let mut background = JoinSet::new();
    if inner.config.wake == WakeMode::ListenAndPoll {
        background.spawn(listener::listen(
            inner.pg.clone(),
            inner.wake.clone(),
            inner.listener_connected.clone(),
            stop.clone(),
        ));
    }
    background.spawn(reclaimer(inner.clone(), stop.clone()));
    if !inner.config.stranded_sweep_interval.is_zero() {
        background.spawn(stranded_sweeper(inner.clone(), stop.clone()));
    }
    background.spawn(statistics(inner.clone(), stop.clone()));
    if !inner.config.sample_interval.is_zero() {
        background.spawn(sampler(inner.clone(), stop.clone()));
    }
    background
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
                inner
                    .config
                    .events
                    .emit(super::RelayEvent::Reclaimed { n: n as usize });
                inner.wake.notify_one();
            }
            Err(e) => tracing::debug!(error = %e, "lease reclaim failed; will try again"),
        }
    }
}

/// Ordering keys a sweep looks at: the next sweep goes on from the last.
const STRANDED_SWEEP_KEYS: i64 = 1000;

/// Every `stranded_sweep_interval`, makes due the first row of up to [`STRANDED_SWEEP_KEYS`]
/// ordering keys when it still waits with nothing ahead of it, going round the keys sweep after
/// sweep (`messages/unpark_stranded.sql`), and wakes the claimer when it did. A safety net: the
/// paths that take a head out of the hot table make the next row due themselves.
async fn stranded_sweeper(inner: Arc<Inner>, stop: Arc<Notify>) {
    let mut after = String::new();
    loop {
        tokio::select! {
            _ = stop.notified() => return,
            _ = tokio::time::sleep(inner.config.stranded_sweep_interval) => {}
        }
        let swept = async {
            let client = inner.pool.get().await?;
            let conn = Pooled::unnamed(&client);
            Ok::<_, Error>(
                store::messages::unpark_stranded(&conn, &after, STRANDED_SWEEP_KEYS).await?,
            )
        };
        match swept.await {
            Ok(sweep) => {
                after = sweep.last_key.unwrap_or_default();
                if sweep.unparked > 0 {
                    tracing::warn!(
                        rows = sweep.unparked,
                        "made due rows that waited behind an ordering head no longer there"
                    );
                    inner.wake.notify_one();
                }
            }
            Err(e) => tracing::debug!(error = %e, "waiting-row sweep failed; will try again"),
        }
    }
}

/// Makes due every row written waiting behind an earlier row of its ordering key that is no
/// longer in the hot table (a head deleted by hand, or by a path that raced the row's
/// enqueue); returns how many. Relays do it a thousand keys at a time, every
/// [`stranded_sweep_interval`](super::RelayConfig::stranded_sweep_interval); exposed for
/// operators and tests.
pub async fn unpark_stranded(pool: &deadpool_postgres::Pool) -> Result<u64> {
    let client = pool.get().await?;
    let conn = Pooled::unnamed(&client);
    let mut after = String::new();
    let mut total = 0;
    loop {
        let sweep = store::messages::unpark_stranded(&conn, &after, STRANDED_SWEEP_KEYS).await?;
        total += u64::try_from(sweep.unparked).unwrap_or(0);
        match sweep.last_key {
            Some(key) => after = key,
            None => return Ok(total),
        }
    }
}

/// How often a relay looks whether the hot table lacks statistics.
const STATISTICS_CHECK: Duration = Duration::from_secs(1);

/// Gathers the hot table's statistics when it holds rows the planner knows nothing of: a table
/// never analyzed (a new installation's first burst, before autovacuum's first ANALYZE) makes the
/// planner guess a dozen pending rows, and every claim then reads the whole backlog and sorts
/// it. Looks at start and every [`STATISTICS_CHECK`] until the table has statistics (they stay),
/// or, with a warning, until ANALYZE leaves it without (a role that does not own it).
async fn statistics(inner: Arc<Inner>, stop: Arc<Notify>) {
    loop {
        match gather_missing_statistics(&inner.pool).await {
            Ok(Gathering::Present) => return,
            Ok(Gathering::Gathered) => {
                tracing::info!("analyzed txoutbox_messages: it held rows but no statistics");
                return;
            }
            Ok(Gathering::NotAllowed) => {
                tracing::warn!(
                    "txoutbox_messages has no statistics and this relay's role cannot ANALYZE it: \
                     claims read the whole backlog until autovacuum analyzes it (run ANALYZE \
                     txoutbox_messages as its owner)"
                );
                return;
            }
            Ok(Gathering::NotYet) => {}
            Err(e) => tracing::debug!(error = %e, "statistics check failed; will try again"),
        }
        tokio::select! {
            _ = stop.notified() => return,
            _ = tokio::time::sleep(STATISTICS_CHECK) => {}
        }
    }
}

/// What the statistics check found or did.
enum Gathering {
    /// The table has statistics.
    Present,
    /// It had none and holds 1 000 rows or more: analyzed now.
    Gathered,
    /// ANALYZE left it without statistics.
    NotAllowed,
    /// It has none, but too few rows to matter yet.
    NotYet,
}

async fn gather_missing_statistics(pool: &deadpool_postgres::Pool) -> Result<Gathering> {
    let client = pool.get().await?;
    let conn = Pooled::unnamed(&client);
    let found = store::messages::statistics(&conn).await?;
    if found.analyzed {
        return Ok(Gathering::Present);
    }
    if !found.large {
        return Ok(Gathering::NotYet);
    }
    store::messages::analyze(&conn).await?;
    if store::messages::statistics(&conn).await?.analyzed {
        return Ok(Gathering::Gathered);
    }
    Ok(Gathering::NotAllowed)
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
    let backlog = store::messages::sample_backlog(&Pooled::unnamed(&client))
        .await?
        .ok_or_else(|| Error::Internal("the backlog sample returned no row".into()))?;
    Ok((backlog.pending, backlog.oldest_secs))
}

/// Takes back every row whose lease has expired; returns how many. Run by every relay
/// periodically; exposed for operators and tests.
pub async fn reclaim_expired(pool: &deadpool_postgres::Pool) -> Result<u64> {
    let client = pool.get().await?;
    let mut total = 0;
    loop {
        let limit = 1000i64;
        let moved = store::messages::reclaim_expired(&Pooled::unnamed(&client), limit).await?;
        total += moved as u64;
        if moved < limit {
            return Ok(total);
        }
    }
}
