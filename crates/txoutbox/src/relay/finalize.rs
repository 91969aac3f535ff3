//! The shutdown drain: no more claims; deliveries in flight finish within the grace period
//! (counted from the shutdown signal); the rest are cut off and given back; every outcome is
//! flushed, bounded by [`SHUTDOWN_FLUSH`]; rows claimed and never started are given back; then the
//! background services stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::claim::release_unstarted;
use super::dispatch::Dispatch;
use super::give_back::given_back;
use super::held::Stage;
use super::{presence, Outcome, RelayReport, SHUTDOWN_FLUSH};

/// What runs beside the claim loop until the shutdown drain stops it.
pub(super) struct Services {
    /// Tells the background services to stop.
    pub stop: Arc<Notify>,
    /// The reclaim of expired leases and the backlog sampler.
    pub background: JoinSet<()>,
    /// Set once the deliveries are over: the completer gives up on a database that stays away.
    pub shutting_down: Arc<AtomicBool>,
    pub heartbeat: presence::Heartbeat,
    pub completer: JoinHandle<()>,
}

/// Drains the relay after the shutdown signal came at `stopping_at`.
pub(super) async fn finalize(
    dispatch: Dispatch,
    services: Services,
    stopping_at: Instant,
    report: &mut RelayReport,
) {
    dispatch.stop();
    let Dispatch {
        inner,
        mut deliveries,
        held,
        done,
        ..
    } = dispatch;
    let config = &inner.config;
    tracing::info!(owner = %config.owner, in_flight = deliveries.len(), "relay stopping");
    config.events.emit(super::events::RelayEvent::Stopping);
    let grace_end = stopping_at + config.shutdown_grace;
    let drained = tokio::time::timeout_at(grace_end, async {
        while deliveries.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        deliveries.abort_all();
        while deliveries.join_next().await.is_some() {}
    }
    services.shutting_down.store(true, Ordering::Relaxed);
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
    let mut completer = services.completer;
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
    services.stop.notify_waiters();
    let mut background = services.background;
    background.abort_all();
    while background.join_next().await.is_some() {}
    services.heartbeat.stop().await;
    tracing::info!(owner = %config.owner, claimed = report.claimed, released = report.released, "relay stopped");
}
