//! The claim loop: while the local queue has room ([`Dispatch::room`]) it claims due rows
//! (fanning out deferred effects first when due) and hands them to [`Dispatch`]; with no backlog left it waits for a wake-up or
//! the poll interval. It returns when the shutdown signal comes, with the moment it came.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use super::claim::{claim, Claimed};
use super::dispatch::Dispatch;
use super::{flow, RelayReport, CLAIM_WAIT, FAN_OUT_INTERVAL};
use crate::error::Result;

/// The claim loop's own state between two claims.
pub(super) struct ClaimLoop<'a> {
    dispatch: &'a mut Dispatch,
    report: &'a mut RelayReport,
    /// Claims failed in a row (the back-off grows with them).
    failures: u32,
    /// The destinations' rate limits are recorded.
    registered: bool,
    /// Fan out before the next claim: at start, after a wake-up (the write path's hint, a poll),
    /// after a fan-out that left keys to fan out, and at least every FAN_OUT_INTERVAL while a
    /// backlog keeps the loop claiming back to back.
    fan_out_due: bool,
    last_fan_out: Instant,
}

/// What one turn of the loop leads to.
enum Turn {
    /// Claim again at once.
    Again,
    /// Wait for a wake-up, the poll interval, or a held-back destination's next change.
    Wait(Option<Duration>),
    /// The shutdown signal came at this moment.
    Stop(Instant),
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
        }
    }

    /// Claims and dispatches until `shutdown` resolves; returns when it did.
    pub(super) async fn run<F: Future<Output = ()>>(
        mut self,
        mut shutdown: Pin<&mut F>,
    ) -> Instant {
        loop {
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
            let wait = match self.turn(room, shutdown.as_mut()).await {
                Turn::Again => continue,
                Turn::Stop(at) => return at,
                Turn::Wait(next_change) => next_change,
            };
            let config = &self.dispatch.inner.config;
            let wait = wait.map_or(config.poll_interval, |d| d.min(config.poll_interval));
            tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Instant::now(),
                _ = self.dispatch.inner.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
            self.fan_out_due = true;
        }
    }

    /// One claim of up to `want` rows, dispatched.
    async fn turn<F: Future<Output = ()>>(&mut self, want: usize, shutdown: Pin<&mut F>) -> Turn {
        let (claimed, stopping) = match self.claim(want, shutdown).await {
            Ok(claimed) => claimed,
            Err(turn) => return turn,
        };
        let Claimed {
            leases: rows,
            undecodable,
            again,
            fan_out_more,
            next_change,
        } = claimed;
        self.report.claimed += (rows.len() + undecodable.len()) as u64;
        self.dispatch
            .inner
            .config
            .events
            .claimed(rows.len() + undecodable.len());
        if let Some(at) = stopping {
            // Hold the rows so that the shutdown gives them back.
            let held = &self.dispatch.held;
            for lease in rows
                .into_iter()
                .chain(undecodable.into_iter().map(|(l, _)| l))
            {
                held.insert(lease);
            }
            return Turn::Stop(at);
        }
        self.fan_out_due = fan_out_more;
        let full = rows.len() + undecodable.len() == want || again;
        self.dispatch.rows(rows, undecodable).await;
        if full {
            Turn::Again // a backlog: claim again at once
        } else {
            // A destination held back (tokens spent, a breaker's cool-down) may have rows again
            // before the next poll: wait no longer than that.
            Turn::Wait(next_change)
        }
    }

    /// Sends one claim and waits for it. A shutdown signal while it runs still takes its rows
    /// (its UPDATE commits on the server whether or not anyone waits), with the moment the
    /// signal came. A failed claim is retried after a pause that grows with the failures.
    async fn claim<F: Future<Output = ()>>(
        &mut self,
        want: usize,
        mut shutdown: Pin<&mut F>,
    ) -> Result<(Claimed, Option<Instant>), Turn> {
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
        let fan_out = self.fan_out_due || self.last_fan_out.elapsed() >= FAN_OUT_INTERVAL;
        if fan_out {
            self.last_fan_out = Instant::now();
        }
        let claim = claim(&inner, want, held.ids(), &bounds, fan_out);
        tokio::pin!(claim);
        let (claimed, stopping) = tokio::select! {
            biased;
            _ = shutdown.as_mut() => {
                let at = Instant::now();
                match tokio::time::timeout(CLAIM_WAIT, &mut claim).await {
                    Ok(claimed) => (claimed, Some(at)),
                    Err(_) => return Err(Turn::Stop(at)),
                }
            }
            claimed = &mut claim => (claimed, None),
        };
        match claimed {
            Ok(claimed) => {
                self.failures = 0;
                Ok((claimed, stopping))
            }
            Err(e) => {
                if let Some(at) = stopping {
                    return Err(Turn::Stop(at));
                }
                self.failures += 1;
                tracing::warn!(error = %e, "claim failed; retrying");
                let pause = Duration::from_millis(50 * 2u64.pow(self.failures.min(6)))
                    .min(inner.config.poll_interval.max(Duration::from_millis(100)));
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => Err(Turn::Stop(Instant::now())),
                    _ = tokio::time::sleep(pause) => Err(Turn::Again),
                }
            }
        }
    }
}
