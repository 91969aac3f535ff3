//! Flow control per destination: which destinations a claim may take rows of, and how many.
//!
//! The shared part lives in `txoutbox_destinations`, one row per destination, read and spent by
//! the claim statement itself (`store::messages::claim_due`): an operator's pause, the
//! downstream's throttle, the breaker's state, and the token bucket of a rate limit, so that
//! every relay of a deployment obeys one budget. What is this relay's own is passed to the claim
//! as a bound per destination: the room left under its in-flight limit or its ramp after a
//! pause, and a hold it set itself (before the shared row says so).
//!
//! A `Retry-After` on one answer is that row's: it delays the row. The destination pauses only
//! when the downstream as a whole throttles: most of this relay's answers from it over the last
//! [`THROTTLE_WINDOW`] ([`Flow::answered`]). After a pause each relay ramps back up, one more
//! call in flight per delivery. Outcomes feed the shared row back ([`feedback`]): consecutive
//! retryable failures open the breaker, a delivered probe closes it, a tripped window throttles
//! the destination. The transitions are a pure function ([`BreakerColumns::apply`]) of the
//! row's state and the batch's outcomes, in finishing order.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::{Finished, Inner};
use crate::error::Result;
use crate::store::destinations::{self, BreakerColumns, BreakerRow};
use crate::store::Pooled;

/// How long a relay remembers a destination's answers when it judges whether the downstream as
/// a whole throttles.
pub(super) const THROTTLE_WINDOW: Duration = Duration::from_secs(10);
/// The share of those answers that must be throttled (429/503 with `Retry-After`)...
pub(super) const THROTTLE_SHARE: f64 = 0.5;
/// ...and how many at least, so that a few rows' answers on a quiet destination do not pause it.
pub(super) const THROTTLE_MIN: usize = 5;
/// The answers remembered per destination at most (the oldest go first).
const THROTTLE_MEMORY: usize = 1000;
/// Calls in flight per relay when a destination comes back from a throttle; one more per
/// delivery after that, up to the relay's limit for it.
pub(super) const RAMP_START: usize = 2;

/// What an attempt tells the destination's shared row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signal {
    /// The downstream took it.
    Delivered,
    /// A retryable failure, or a call that reached no verdict.
    Failed,
    /// A permanent failure: the row was refused (by the downstream or by its sink before any
    /// call), or it ended without a call (undecodable, handed back unstarted), which says nothing
    /// of the downstream's health. It neither counts nor closes; a probe that ends so frees the
    /// probe, so the next one goes at the next claim instead of waiting out the probe's lease.
    Inconclusive,
    /// This answer tipped the window: `throttled` of this relay's last `answers` were throttled,
    /// and the downstream asked to wait `wait` (the longest it asked, bounded by the retry cap).
    Throttle {
        wait: Duration,
        throttled: u32,
        answers: u32,
    },
}

/// This relay's view of flow control between claims.
#[derive(Default)]
pub(super) struct Flow {
    local: Mutex<Local>,
}

#[derive(Default)]
struct Local {
    /// Destinations this relay claims nothing of until then (a throttle it saw).
    holds: HashMap<String, Instant>,
    /// Destinations whose shared row is not plain closed (the last claim said so, or a failure
    /// was seen here since): their deliveries are reported, so the row can close and reset.
    suspect: HashSet<String>,
    /// This relay's recent answers per destination: when, and the `Retry-After` of a throttled
    /// one (the last [`THROTTLE_WINDOW`]).
    answers: HashMap<String, VecDeque<(Instant, Option<Duration>)>>,
    /// Destinations coming back from a throttle: at most this many calls in flight here.
    ramp: HashMap<String, usize>,
    /// The state last published per destination (metrics change only on a change).
    published: HashMap<String, &'static str>,
    /// Rate-limited destinations: the spacing of their calls and the next free slot. A claim
    /// takes the bucket's whole tokens at once; its calls go out spaced at the rate, so the
    /// downstream sees a steady flow, not bursts (a downstream's own bucket of the same rate
    /// then keeps its saved tokens to absorb jitter).
    pace: HashMap<String, (Duration, Instant)>,
}

/// The bounds one claim passes: destinations with a bound of this relay's own, and how many rows
/// of each the claim may take (0: none).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Bounds {
    pub destinations: Vec<String>,
    pub room: Vec<i64>,
}

/// A destination's shared state as the claim saw it (and spent its tokens).
#[derive(Debug, Clone, serde::Deserialize)]
pub(super) struct Gate {
    pub destination: String,
    /// `paused`, `throttled` (the downstream asked every relay to wait), `open`, `probing`
    /// (half-open, its probe out), `probe` (half-open, a probe may go), `closed`.
    pub state: String,
    /// Tokens left after the claim (rate-limited destinations only).
    pub tokens: Option<f64>,
    /// Its rate limit, calls per second.
    pub rate: Option<f64>,
    /// Seconds until a throttle ends, or an open breaker lets a probe through.
    pub open_for: Option<f64>,
    /// Consecutive failures recorded.
    pub failures: i32,
}

impl Flow {
    /// The bounds of this relay's own for the next claim of at most `want` rows, given how many
    /// rows of each destination it holds now.
    pub(super) fn bounds(
        &self,
        inner: &Inner,
        want: usize,
        holding: &HashMap<String, usize>,
    ) -> Bounds {
        let now = Instant::now();
        let mut bounds = Bounds::default();
        let Ok(mut guard) = self.local.lock() else {
            return bounds;
        };
        let local = &mut *guard;
        local.holds.retain(|_, until| *until > now);
        // Each destination's limit on this relay: its in-flight limit, its ramp, the lower.
        let mut limits: HashMap<&str, usize> = HashMap::new();
        for (destination, policy) in inner.policies.iter() {
            if let Some(max) = policy.flow.max_in_flight {
                limits.insert(destination, max);
            }
        }
        if let Some(max) = inner.default_policy.flow.max_in_flight {
            for destination in inner.sinks.keys() {
                if !inner.policies.contains_key(destination) {
                    limits.insert(destination, max);
                }
            }
        }
        for (destination, ramp) in &local.ramp {
            let limit = limits.entry(destination).or_insert(*ramp);
            *limit = (*limit).min(*ramp);
        }
        for destination in local.holds.keys() {
            bounds.destinations.push(destination.clone());
            bounds.room.push(0);
        }
        for (destination, limit) in limits {
            if local.holds.contains_key(destination) {
                continue;
            }
            let busy = holding.get(destination).copied().unwrap_or(0);
            bounds.destinations.push(destination.to_owned());
            bounds
                .room
                .push(limit.saturating_sub(busy).min(want) as i64);
        }
        bounds
    }

    /// Takes in one answer (or a call that reached none) of `destination`: `throttled` is the
    /// `Retry-After` of an answer that asked to wait. When most of this relay's answers from the
    /// destination over [`THROTTLE_WINDOW`] asked to wait (at least [`THROTTLE_MIN`] of them,
    /// [`THROTTLE_SHARE`] of all), the downstream as a whole is throttling: this relay holds the
    /// destination at once for the longest wait asked (at most `cap`), starts its ramp, forgets
    /// the answers counted, and returns the [`Signal::Throttle`] that pauses every relay.
    /// Answers to calls that left before a hold of this relay's are not counted.
    /// A delivery widens a ramp by one call, up to `ceiling` (where the ramp ends).
    pub(super) fn answered(
        &self,
        destination: &str,
        throttled: Option<Duration>,
        delivered: bool,
        cap: Duration,
        ceiling: usize,
    ) -> Option<Signal> {
        let mut local = self.local.lock().ok()?;
        let now = Instant::now();
        if delivered {
            if let Some(ramp) = local.ramp.get_mut(destination) {
                *ramp += 1;
                if *ramp >= ceiling {
                    local.ramp.remove(destination);
                }
            }
        }
        if local
            .holds
            .get(destination)
            .is_some_and(|until| *until > now)
        {
            return None;
        }
        let answers = local.answers.entry(destination.to_owned()).or_default();
        while answers
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > THROTTLE_WINDOW)
            || answers.len() >= THROTTLE_MEMORY
        {
            answers.pop_front();
        }
        answers.push_back((now, throttled));
        throttled?;
        let waits: Vec<Duration> = answers.iter().filter_map(|(_, wait)| *wait).collect();
        let total = answers.len();
        if waits.len() < THROTTLE_MIN || (waits.len() as f64) < THROTTLE_SHARE * total as f64 {
            return None;
        }
        let wait = waits.iter().max().copied().unwrap_or_default().min(cap);
        let signal = Signal::Throttle {
            wait,
            throttled: u32::try_from(waits.len()).unwrap_or(u32::MAX),
            answers: u32::try_from(total).unwrap_or(u32::MAX),
        };
        answers.clear();
        let until = now + wait;
        let hold = local.holds.entry(destination.to_owned()).or_insert(until);
        *hold = (*hold).max(until);
        local
            .ramp
            .insert(destination.to_owned(), RAMP_START.min(ceiling));
        local.suspect.insert(destination.to_owned());
        Some(signal)
    }

    /// Takes in what a claim saw of the shared state: which destinations to report deliveries
    /// of, the state metrics, and how long until a held-back destination may have rows again
    /// (the claim loop waits no longer than that).
    pub(super) fn observe<'a>(
        &self,
        gates: &[Gate],
        bounds: &Bounds,
        served: impl Iterator<Item = &'a String>,
    ) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        let mut soonest = |d: Duration| next = Some(next.map_or(d, |n| n.min(d)));
        let Ok(mut local) = self.local.lock() else {
            return None;
        };
        let mut states: HashMap<&str, &'static str> = HashMap::new();
        let rated: HashSet<&str> = gates
            .iter()
            .filter(|g| g.rate.is_some_and(|r| r > 0.0))
            .map(|g| g.destination.as_str())
            .collect();
        local.pace.retain(|d, _| rated.contains(d.as_str()));
        for gate in gates {
            if let Some(rate) = gate.rate.filter(|r| *r > 0.0) {
                let interval = Duration::from_secs_f64(1.0 / rate);
                let now = Instant::now();
                local
                    .pace
                    .entry(gate.destination.clone())
                    .and_modify(|p| p.0 = interval)
                    .or_insert((interval, now));
            }
            let state = match gate.state.as_str() {
                "paused" => "paused",
                "open" | "throttled" => "open",
                "probing" | "probe" => "half_open",
                _ => "closed",
            };
            states.insert(&gate.destination, state);
            if gate.state == "throttled" {
                // The downstream throttled (another relay may have seen it): come back ramping.
                local.ramp.insert(gate.destination.clone(), RAMP_START);
            }
            if state != "closed" || gate.failures > 0 {
                local.suspect.insert(gate.destination.clone());
            }
            if let (Some(tokens), Some(rate)) = (gate.tokens, gate.rate) {
                metrics::gauge!(crate::telemetry::DESTINATION_TOKENS, "destination" => gate.destination.clone())
                    .set(tokens.max(0.0));
                if tokens < 1.0 && rate > 0.0 {
                    soonest(Duration::from_secs_f64(
                        ((1.0 - tokens) / rate).clamp(0.001, 60.0),
                    ));
                }
            }
            if let Some(open_for) = gate.open_for.filter(|_| state == "open") {
                soonest(Duration::from_secs_f64(open_for.clamp(0.001, 3600.0)));
            }
            if state != "closed" || gate.tokens.is_some_and(|t| t < 1.0) {
                metrics::counter!(crate::telemetry::DESTINATION_THROTTLED, "destination" => gate.destination.clone())
                    .increment(1);
            }
        }
        let now = Instant::now();
        for (destination, room) in bounds.destinations.iter().zip(&bounds.room) {
            if *room == 0 {
                metrics::counter!(crate::telemetry::DESTINATION_THROTTLED, "destination" => destination.clone())
                    .increment(1);
            }
            if let Some(until) = local.holds.get(destination) {
                soonest(until.saturating_duration_since(now));
            }
        }
        // Destinations the claim did not mention are closed (their row has no state); publish
        // only what changed.
        let mut quiet: Vec<String> = local.published.keys().cloned().collect();
        quiet.extend(served.cloned());
        for destination in quiet {
            if !states.contains_key(destination.as_str()) {
                publish(&mut local.published, &destination, "closed");
            }
        }
        for (destination, state) in states {
            publish(&mut local.published, destination, state);
        }
        next
    }

    /// When the call of a row just claimed for `destination` should start: `None` (now) unless
    /// the destination is rate-limited, then the next slot at its rate, no further out than
    /// `longest` (a slot beyond it would eat the lease).
    pub(super) fn slot(&self, destination: &str, longest: Duration) -> Option<Instant> {
        let mut local = self.local.lock().ok()?;
        let (interval, next) = local.pace.get_mut(destination)?;
        let now = Instant::now();
        let slot = (*next).max(now).min(now + longest);
        *next = slot + *interval;
        (slot > now).then_some(slot)
    }

    /// Whether a delivery to `destination` is worth reporting to the shared row.
    pub(super) fn is_suspect(&self, destination: &str) -> bool {
        self.local
            .lock()
            .map(|l| l.suspect.contains(destination))
            .unwrap_or(true)
    }

    fn settle(&self, destination: &str, shared: &BreakerColumns) {
        if let Ok(mut local) = self.local.lock() {
            if shared.breaker == "closed" && shared.failures == 0 {
                local.suspect.remove(destination);
            } else {
                local.suspect.insert(destination.to_owned());
            }
        }
    }
}

fn publish(published: &mut HashMap<String, &'static str>, destination: &str, state: &'static str) {
    if published.get(destination) == Some(&state) {
        return;
    }
    for s in ["closed", "open", "half_open", "paused"] {
        metrics::gauge!(
            crate::telemetry::DESTINATION_STATE,
            "destination" => destination.to_owned(),
            "state" => s,
        )
        .set(if s == state { 1.0 } else { 0.0 });
    }
    published.insert(destination.to_owned(), state);
}

/// Writes this relay's rate limits for the destinations it serves (the last relay to start
/// sets a destination's budget: configure every relay alike), and makes sure every one has its
/// row, so the breaker can count.
pub(super) async fn register(inner: &Inner) -> Result<()> {
    let mut destinations: Vec<&String> = inner.sinks.keys().collect();
    destinations.sort();
    let rates: Vec<Option<f64>> = destinations
        .iter()
        .map(|d| inner.policy(d).flow.rate_limit.map(|r| r.per_second))
        .collect();
    let bursts: Vec<Option<f64>> = destinations
        .iter()
        .map(|d| inner.policy(d).flow.rate_limit.map(|r| r.burst))
        .collect();
    let client = inner.pool.get().await?;
    destinations::register_destinations(&Pooled::unnamed(&client), &destinations, &rates, &bursts)
        .await?;
    Ok(())
}

/// A batch's signals worth writing back, in finishing order: failures, and deliveries to
/// destinations whose row is not plain closed. Empty when there is nothing to write.
pub(super) fn signals(inner: &Inner, batch: &[Finished]) -> Vec<(String, DateTime<Utc>, Signal)> {
    let mut out: Vec<_> = batch
        .iter()
        .filter_map(|f| {
            let signal = f.signal?;
            let destination = &f.lease.delivery.destination;
            let quiet = matches!(signal, Signal::Delivered | Signal::Inconclusive);
            (!quiet || inner.flow.is_suspect(destination))
                .then(|| (destination.clone(), f.finished, signal))
        })
        .collect();
    out.sort_by_key(|(_, at, _)| *at);
    out
}

/// Feeds [`signals`] back to the shared rows of their destinations.
pub(super) async fn feedback(
    inner: &Inner,
    events: &[(String, DateTime<Utc>, Signal)],
) -> Result<()> {
    let mut signals: HashMap<&str, Vec<Signal>> = HashMap::new();
    for (destination, _, signal) in events {
        signals
            .entry(destination.as_str())
            .or_default()
            .push(*signal);
    }
    if signals.is_empty() {
        return Ok(());
    }
    let mut destinations: Vec<&str> = signals.keys().copied().collect();
    destinations.sort_unstable();
    let mut client = inner.pool.get().await?;
    let tx = client.transaction().await?;
    let conn = Pooled::unnamed(&tx);
    destinations::ensure_destinations(&conn, &destinations).await?;
    let rows = destinations::lock_breakers(&conn, &destinations).await?;
    let mut updated: Vec<BreakerRow> = Vec::new();
    for (row, now) in rows {
        let BreakerRow {
            destination,
            columns: current,
        } = row;
        let policy = inner.policy(&destination);
        let next = current.clone().apply(
            &signals[destination.as_str()],
            policy.flow.breaker.as_ref(),
            now,
        );
        inner.flow.settle(&destination, &next);
        if next != current {
            if next.throttled_until != current.throttled_until {
                tracing::warn!(destination = %destination, reason = next.throttle_reason.as_deref().unwrap_or(""), "destination paused: the downstream throttles; no calls until the time it asked");
            }
            if next.breaker == "open" && current.breaker != "open" {
                tracing::warn!(destination = %destination, reason = next.open_reason.as_deref().unwrap_or(""), "destination open: no calls until its cool-down ends");
            } else if next.breaker == "closed" && current.breaker != "closed" {
                tracing::info!(destination = %destination, "destination closed again: the probe was delivered");
            }
            updated.push(BreakerRow {
                destination,
                columns: next,
            });
        }
    }
    if !updated.is_empty() {
        destinations::update_breakers(&conn, &updated).await?;
    }
    tx.commit().await?;
    Ok(())
}

mod shared;
#[cfg(test)]
mod tests;
