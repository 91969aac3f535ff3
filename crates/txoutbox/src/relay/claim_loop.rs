//! The claim loop: while the local queue has room ([`Dispatch::room`]) it claims due rows and
//! hands them to [`Dispatch`]; with no backlog left it waits for a wake-up or the poll interval.
//! It returns when the shutdown signal comes, with the moment it came.
//!
//! Deferred effects are fanned out beside the claims, one fan-out at a time on a connection of
//! its own, so that no claim waits for one: after a wake-up, and at least every
//! FAN_OUT_INTERVAL while a backlog keeps the loop claiming back to back. A fan-out that wrote
//! rows wakes the loop (a claim sent before its commit cannot see them); one that left keys to
//! fan out, or that a wake-up came during, is followed by another.
//!
//! Through a backlog one claim is out at a time, each sent as the one before is back. An idle
//! relay that bounds no destination itself answers a wake-up at once, even while a claim is out
//! (up to [`CLAIMS_IN_FLIGHT`] claims): the claim out took its snapshot before the commit that
//! woke the relay, so without another claim the new rows would wait for it to come back and for
//! a claim after it, a claim and a half instead of one. The claims out share the room: an idle
//! claim takes no more than its share of it, and one that comes back full turns the loop back to
//! one claim at a time. Concurrent claims skip each other's rows as two relays' claims do (row
//! locks, `SKIP LOCKED`); a relay that bounds a destination (an in-flight limit, a ramp, a hold)
//! never overlaps its claims, so its bounds hold.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::claim::{claim, fan_out_beside, Claimed, Fanned};
use super::dispatch::Dispatch;
use super::{flow, RelayReport, CLAIM_WAIT, FAN_OUT_INTERVAL, FAN_OUT_ON_WAKE_FOR};
use crate::error::Result;

/// The most claims an idle relay has out at once.
pub(super) const CLAIMS_IN_FLIGHT: usize = 2;

/// A claim sent, with the rows it may take.
type Sent = Pin<Box<dyn Future<Output = (usize, Result<Claimed>)> + Send>>;

/// The claim loop's own state between two claims.
pub(super) struct ClaimLoop<'a> {
    dispatch: &'a mut Dispatch,
    report: &'a mut RelayReport,
    /// Claims failed in a row (the back-off grows with them).
    failures: u32,
    /// The destinations' rate limits are recorded.
    registered: bool,
    /// Fan out with the next claim (or once the fan-out out is back): at start, after a wake-up
    /// (the write path's hint, a poll), after a fan-out that left keys to fan out.
    fan_out_due: bool,
    last_fan_out: Instant,
    /// The fan-out out, if any; it answers whether keys are left to fan out.
    fanning: Option<JoinHandle<Fanned>>,
    /// When a fan-out last found deferred effects: for [`FAN_OUT_ON_WAKE_FOR`] after it, every
    /// wake-up fans out; past it, a wake-up only claims (the fan-out follows within
    /// [`FAN_OUT_INTERVAL`] of the last, and at every poll).
    effects_seen: Option<Instant>,
    /// A wake-up came without a fan-out: one is sent [`FAN_OUT_INTERVAL`] after the last, so a
    /// service that begins to defer effects waits no longer than that for its first.
    fan_out_owed: bool,
    /// The claims out, not back yet.
    in_flight: FuturesUnordered<Sent>,
    /// The rows the claims out may take, together.
    wanted: usize,
    /// The last claim back was full (or must be followed at once): claims go one at a time,
    /// each taking the whole room. True at start: rows may have waited for the relay.
    backlog: bool,
    /// Claim again as soon as no claim is out, without waiting for a wake-up.
    again: bool,
    /// How long until a destination a claim held back may have rows again.
    next_change: Option<Duration>,
    /// The last claim sent carried bounds of this relay's own: no claim overlaps it.
    bounded: bool,
}

impl<'a> ClaimLoop<'a> {
    pub(super) fn new(dispatch: &'a mut Dispatch, report: &'a mut RelayReport) -> Self {
        ClaimLoop {
            dispatch,
            report,
            failures: 0,
            registered: false,
            fan_out_due: true,
            last_fan_out: Instant::now(),
            fanning: None,
            effects_seen: None,
            fan_out_owed: false,
            in_flight: FuturesUnordered::new(),
            wanted: 0,
            backlog: true,
            again: true,
            next_change: None,
            bounded: false,
        }
    }

    /// Claims and dispatches until `shutdown` resolves; returns when it did.
    pub(super) async fn run<F: Future<Output = ()>>(
        mut self,
        mut shutdown: Pin<&mut F>,
    ) -> Instant {
        loop {
            if self.in_flight.is_empty() {
                if !self.again {
                    if let Some(at) = self.idle(shutdown.as_mut()).await {
                        return at;
                    }
                }
                let room = self.dispatch.room();
                if room == 0 {
                    // The queue is deep enough: claim again when a queued row takes a slot, or a
                    // running call frees one.
                    let (slots, took) = (self.dispatch.slots.clone(), self.dispatch.took.clone());
                    tokio::select! {
                        biased;
                        _ = shutdown.as_mut() => return Instant::now(),
                        _ = took.notified() => continue,
                        permit = slots.acquire() => { drop(permit); continue; }
                    }
                }
                let want = if self.backlog {
                    room
                } else {
                    room.div_ceil(CLAIMS_IN_FLIGHT)
                };
                self.send(want, false).await;
                continue;
            }
            let overlap = !self.backlog
                && !self.bounded
                && self.in_flight.len() < CLAIMS_IN_FLIGHT
                && !self
                    .dispatch
                    .inner
                    .flow_seen
                    .load(std::sync::atomic::Ordering::Relaxed);
            let wake = self.dispatch.inner.wake.clone();
            tokio::select! {
                biased;
                _ = shutdown.as_mut() => return self.stop(Instant::now()).await,
                Some((want, claimed)) = self.in_flight.next() => {
                    self.wanted -= want;
                    if let Some(at) = self.back(want, claimed, shutdown.as_mut()).await {
                        return self.stop(at).await;
                    }
                }
                done = fanned(&mut self.fanning) => self.fanned(done),
                _ = wake.notified(), if overlap => {
                    self.woken();
                    let want = self.dispatch.room().saturating_sub(self.wanted);
                    if want == 0 || !self.send(want, true).await {
                        self.again = true; // claim once the claims out are back
                    }
                }
            }
        }
    }

    /// Waits, no claim being out and no backlog left, for a wake-up, the poll interval, or a
    /// held-back destination's next change; `Some` when the shutdown signal came instead.
    async fn idle<F: Future<Output = ()>>(&mut self, mut shutdown: Pin<&mut F>) -> Option<Instant> {
        let config = &self.dispatch.inner.config;
        let wait = self
            .next_change
            .map_or(config.poll_interval, |d| d.min(config.poll_interval));
        let mut until = Instant::now() + wait;
        if self.fan_out_owed {
            until = until.min(self.last_fan_out + FAN_OUT_INTERVAL);
        }
        let wake = self.dispatch.inner.wake.clone();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Some(Instant::now()),
                // Rows it wrote wake the loop up; keys left, or a wake-up during it, go on.
                done = fanned(&mut self.fanning) => { self.fanned(done); continue; }
                _ = wake.notified() => self.woken(),
                _ = tokio::time::sleep_until(until) => self.fan_out_due = true,
            }
            return None;
        }
    }

    /// A wake-up: it fans out too only while deferred effects were seen lately, so a service
    /// that defers none is not sent a fan-out beside every claim a commit wakes; else the
    /// fan-out is owed, sent with the next claim or [`FAN_OUT_INTERVAL`] after the last.
    fn woken(&mut self) {
        if self
            .effects_seen
            .is_some_and(|at| at.elapsed() < FAN_OUT_ON_WAKE_FOR)
        {
            self.fan_out_due = true;
        } else {
            self.fan_out_owed = true;
        }
    }

    /// Starts a fan-out unless one is out (then the one due waits for it to come back).
    fn fan_out(&mut self) {
        if self.fanning.is_none() {
            self.fan_out_due = false;
            self.fan_out_owed = false;
            self.last_fan_out = Instant::now();
            self.fanning = Some(tokio::spawn(fan_out_beside(self.dispatch.inner.clone())));
        }
    }

    /// The fan-out out came back: another follows when it left keys to fan out, or when one
    /// became due while it ran.
    fn fanned(&mut self, done: Fanned) {
        self.fanning = None;
        if done.found {
            self.effects_seen = Some(Instant::now());
        }
        if done.more || self.fan_out_due {
            self.fan_out();
        }
    }

    /// Sends a claim of up to `want` rows. An `overlap` (a claim beside others out) is not sent
    /// when this relay now bounds a destination itself; returns whether the claim was sent.
    async fn send(&mut self, want: usize, overlap: bool) -> bool {
        let inner = self.dispatch.inner.clone();
        if !self.registered {
            match flow::register(&inner).await {
                Ok(()) => self.registered = true,
                Err(e) => {
                    tracing::warn!(error = %e, "could not record the destinations' rate limits; will try again")
                }
            }
        }
        let held = &self.dispatch.held;
        let bounds = inner.flow.bounds(&inner, want, &held.per_destination());
        if overlap && !bounds.destinations.is_empty() {
            return false;
        }
        let ids = held.ids();
        self.bounded = !bounds.destinations.is_empty();
        if self.fan_out_due || self.last_fan_out.elapsed() >= FAN_OUT_INTERVAL {
            self.fan_out();
        }
        self.again = false;
        self.next_change = None;
        self.wanted += want;
        self.in_flight.push(Box::pin(async move {
            (want, claim(&inner, want, ids, &bounds).await)
        }));
        true
    }

    /// Takes a claim back: its rows dispatched, the next step decided. A failed claim is retried
    /// after a pause that grows with the failures; `Some` when the shutdown signal came in it.
    async fn back<F: Future<Output = ()>>(
        &mut self,
        want: usize,
        claimed: Result<Claimed>,
        mut shutdown: Pin<&mut F>,
    ) -> Option<Instant> {
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(e) => {
                self.failures += 1;
                tracing::warn!(error = %e, "claim failed; retrying");
                let config = &self.dispatch.inner.config;
                let pause = Duration::from_millis(50 * 2u64.pow(self.failures.min(6)))
                    .min(config.poll_interval.max(Duration::from_millis(100)));
                self.again = true;
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Some(Instant::now()),
                    _ = tokio::time::sleep(pause) => return None,
                }
            }
        };
        self.failures = 0;
        let Claimed {
            leases: rows,
            undecodable,
            again,
            next_change,
        } = claimed;
        let n = rows.len() + undecodable.len();
        self.count(n);
        self.dispatch.rows(rows, undecodable).await;
        if n == want || again {
            // A backlog: claim again at once, one claim at a time.
            self.backlog = true;
            self.again = true;
        } else {
            self.backlog = false;
            // A destination held back (tokens spent, a breaker's cool-down) may have rows again
            // before the next poll: wait no longer than that.
            self.next_change = match (self.next_change, next_change) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        None
    }

    /// Counts a claim's rows in the report and the test events.
    fn count(&mut self, n: usize) {
        self.report.claimed += n as u64;
        self.dispatch.inner.config.events.claimed(n);
    }

    /// The shutdown signal came at `at`: the claims still out take their rows (their UPDATEs
    /// commit on the server whether or not anyone waits), waited for up to [`CLAIM_WAIT`], and
    /// their rows are held so that the shutdown gives them back.
    async fn stop(mut self, at: Instant) -> Instant {
        let until = at + CLAIM_WAIT;
        while let Ok(Some((_, claimed))) =
            tokio::time::timeout_at(until, self.in_flight.next()).await
        {
            let Ok(claimed) = claimed else { continue };
            self.count(claimed.leases.len() + claimed.undecodable.len());
            let held = &self.dispatch.held;
            for lease in claimed
                .leases
                .into_iter()
                .chain(claimed.undecodable.into_iter().map(|(l, _)| l))
            {
                held.insert(lease);
            }
        }
        if let Some(mut fanning) = self.fanning.take() {
            // Its statement commits or not on the server; nothing waits on its answer.
            if tokio::time::timeout_at(until, &mut fanning).await.is_err() {
                fanning.abort();
            }
        }
        at
    }
}

/// Waits for the fan-out out; never resolves when there is none.
async fn fanned(fanning: &mut Option<JoinHandle<Fanned>>) -> Fanned {
    match fanning {
        Some(fanning) => fanning.await.unwrap_or_default(),
        None => std::future::pending().await,
    }
}
