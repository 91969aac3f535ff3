//! Retry schedules: exponential backoff with full jitter (a uniform delay between zero and
//! `min(cap, base * 2^(attempt-1))`), as the schedule persists in the row's `next_attempt_at`
//! rather than in a retry loop.

use std::time::Duration;

use rand::Rng;

/// How a destination retries.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// The first retry's ceiling.
    pub base: Duration,
    /// No delay exceeds this.
    pub cap: Duration,
    /// After this many attempts the row is dead-lettered.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(15 * 60),
            max_attempts: 12,
        }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt number `attempt` (1-based); `retry_after` from the
    /// downstream wins when given, up to the cap (a downstream that says "in ten thousand years"
    /// is asked again at the cap).
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.cap);
        }
        let exp = attempt.saturating_sub(1).min(30);
        let ceiling = self
            .base
            .saturating_mul(1u32 << exp)
            .min(self.cap)
            .as_secs_f64();
        Duration::from_secs_f64(rand::rng().random_range(0.0..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_under_the_exponential_ceiling_and_the_cap() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            max_attempts: 5,
        };
        for _ in 0..1000 {
            assert!(policy.delay(1, None) <= Duration::from_millis(100));
            assert!(policy.delay(3, None) <= Duration::from_millis(400));
            assert!(policy.delay(30, None) <= Duration::from_secs(1));
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let policy = RetryPolicy::default();
        let delays: std::collections::HashSet<_> = (0..50).map(|_| policy.delay(5, None)).collect();
        assert!(delays.len() > 40, "full jitter gives distinct delays");
    }

    #[test]
    fn a_huge_retry_after_is_capped() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(10_000_000_000_000))),
            policy.cap
        );
    }

    #[test]
    fn retry_after_wins() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
    }
}
