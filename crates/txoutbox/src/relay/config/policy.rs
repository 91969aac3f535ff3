//! Per-destination policies: retry, semantics and flow control (rate limit, in-flight bound,
//! breaker), and the checks that refuse a policy that cannot work.

use std::time::Duration;

use super::MAX_RETRY_DELAY;
use crate::error::{Error, Result};
use crate::relay::RetryPolicy;

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
    /// [`RelayConfig::concurrency`](super::RelayConfig::concurrency)).
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

pub(super) fn check_policy(destination: &str, policy: &DestinationPolicy) -> Result<()> {
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
