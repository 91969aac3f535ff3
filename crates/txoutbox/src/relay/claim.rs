//! The claim: due rows taken under a lease, within the flow-control bounds, and given back at
//! shutdown when their sink was never called.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::{fan_out, flow, Inner, Lease, RelayEvent};
use crate::error::Result;
use crate::sink::Delivery;
use crate::store::{self, Pooled};

/// What a claim took, and what it tells the claim loop.
pub(super) struct Claimed {
    pub leases: Vec<Lease>,
    /// Rows claimed whose stored payload or headers this relay cannot decode, each with the
    /// reason: dead-lettered at once, without a sink call.
    pub undecodable: Vec<(Lease, String)>,
    /// Claim again at once: the claim parked rows waiting behind an ordering-key head (there
    /// may be due rows past them).
    pub again: bool,
    /// How long until a destination the claim held back may have rows again.
    pub next_change: Option<Duration>,
}

/// Claims up to `want` due rows, none of those in `held`, within the flow-control bounds.
pub(super) async fn claim(
    inner: &Inner,
    want: usize,
    held: Vec<Uuid>,
    bounds: &flow::Bounds,
) -> Result<Claimed> {
    let prepared = inner.config.prepared_statements;
    let mut due = store::messages::ClaimDue {
        limit: want as i64,
        owner: &inner.config.owner,
        lease_secs: inner.config.lease.as_secs_f64(),
        held: &held,
        bounded: &bounds.destinations,
        room: &bounds.room,
        // The lean claim while nothing is bounded: this relay bounds no destination, and its
        // last claim saw no destination with a flow-control state.
        unbounded: bounds.destinations.is_empty() && !inner.flow_seen.load(Ordering::Relaxed),
    };
    let lean = if due.unbounded {
        // On a session of the claim pool: its plan is generic, built once.
        let client = inner.claim_pool.get().await?;
        Some(store::messages::claim_due(&Pooled::new(&client, prepared), &due).await?)
    } else {
        None
    };
    let claimed = match lean {
        Some(lean) if !lean.flow => lean,
        // This relay bounds a destination, or one has a flow-control state now: claim within
        // the bounds.
        _ => {
            due.unbounded = false;
            let client = inner.pool.get().await?;
            store::messages::claim_due(&Pooled::new(&client, prepared), &due).await?
        }
    };
    inner
        .flow_seen
        .store(claimed.gates.is_some(), Ordering::Relaxed);
    let gates: Vec<flow::Gate> = match claimed.gates {
        Some(json) => serde_json::from_str(&json).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "unreadable flow-control state");
            Vec::new()
        }),
        None => Vec::new(),
    };
    if !claimed.parked_ids.is_empty() {
        // The claim has committed its rows: a failure here must not lose them, and the park it
        // would end runs out by itself.
        let unparked = async {
            let client = inner.pool.get().await?;
            store::messages::unpark_freed(&Pooled::new(&client, prepared), &claimed.parked_ids)
                .await?;
            Ok::<(), crate::error::Error>(())
        }
        .await;
        if let Err(e) = unparked {
            tracing::debug!(error = %e, "could not end the park of rows whose head is gone");
        }
    }
    let next_change = inner.flow.observe(&gates, bounds, inner.sinks.keys());
    if let Some(row) = claimed.rows.first() {
        inner.presence.claimed(row.attempt_started_at);
    }
    let mut leases = Vec::with_capacity(claimed.rows.len());
    let mut undecodable = Vec::new();
    for row in claimed.rows {
        match decode(row) {
            (lease, None) => leases.push(lease),
            (lease, Some(reason)) => undecodable.push((lease, reason)),
        }
    }
    Ok(Claimed {
        leases,
        undecodable,
        again: claimed.parked > 0,
        next_change,
    })
}

/// What a fan-out beside the claims did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Fanned {
    /// It found deferred effects (it fanned some out, or keys are left).
    pub found: bool,
    /// Keys are left to fan out.
    pub more: bool,
}

/// Fans out deferred effects on a connection of its own, beside the claims, so that no claim
/// waits for it. When it wrote rows it wakes the claim loop: a claim sent before its commit
/// cannot see them. (Its commit does not wait for the WAL flush; the claim that takes its rows
/// starts after it committed, and that claim's flush makes the fan-out durable too.) Returns
/// whether it found deferred effects and whether keys are left to fan out.
pub(super) async fn fan_out_beside(inner: Arc<Inner>) -> Fanned {
    inner.config.events.emit(RelayEvent::LookedForEffects);
    let fanned = async {
        let client = inner.pool.get().await?;
        let conn = Pooled::new(&client, inner.config.prepared_statements);
        fan_out::fan_out(&conn, &inner.poisoned, &inner.config.events).await
    };
    match fanned.await {
        Ok(done) => {
            if done.wrote {
                inner.wake.notify_one();
            }
            Fanned {
                found: done.wrote || done.more,
                more: done.more,
            }
        }
        Err(e) => {
            // The effects wait on their key rows for the next fan-out.
            tracing::warn!(error = %e, "fan-out of deferred effects failed; will try again");
            Fanned::default()
        }
    }
}

/// Decodes a claimed row's stored JSON, one row at a time: a row whose payload or headers this
/// relay cannot read (JSON Postgres accepts and serde_json refuses: nesting deeper than 128, a
/// number beyond `f64`; headers that are not an object of strings) comes back with the reason
/// and its lease (an empty payload and headers), so that it alone is dead-lettered.
fn decode(row: store::messages::ClaimedRow) -> (Lease, Option<String>) {
    let payload = serde_json::from_str::<serde_json::Value>(&row.payload)
        .map_err(|e| format!("the stored payload is not valid for this relay: {e}"));
    let headers = serde_json::from_str::<BTreeMap<String, String>>(&row.headers).map_err(|e| {
        format!("the stored headers are not valid for this relay (an object of strings): {e}")
    });
    let lease = |payload, headers| Lease {
        delivery: Delivery {
            id: row.id,
            destination: row.destination.clone(),
            payload,
            headers,
            downstream_key: row.downstream_key.clone(),
            ordering_key: row.ordering_key.clone(),
            attempt: u32::try_from(row.attempts).unwrap_or(0),
            created_at: row.created_at,
        },
        token: row.lease_token,
        started: row.attempt_started_at,
        claimed_at: std::time::Instant::now(),
    };
    match (payload, headers) {
        (Ok(payload), Ok(headers)) => (lease(payload, headers), None),
        (Err(e), _) | (_, Err(e)) => (lease(serde_json::Value::Null, BTreeMap::new()), Some(e)),
    }
}

/// Gives back the rows this relay holds whose sink was never called (all but `called`).
pub(super) async fn release_unstarted(inner: &Inner, called: Vec<Uuid>) -> Result<u64> {
    let client = inner.pool.get().await?;
    Ok(
        store::messages::release_unstarted(&Pooled::unnamed(&client), &inner.config.owner, &called)
            .await?,
    )
}
