//! The transitions of the shared row's breaker and throttle columns ([`BreakerColumns`], as the
//! store reads and writes them): a pure function of the row's state and a batch's outcomes, in
//! finishing order.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Signal;
use crate::relay::config::Breaker;
use crate::store::destinations::BreakerColumns;

/// The transitions of a destination's breaker and throttle columns.
impl BreakerColumns {
    /// A destination's row as created: the breaker closed, no failure counted, no throttle.
    pub(in crate::relay) fn closed() -> BreakerColumns {
        BreakerColumns {
            breaker: "closed",
            failures: 0,
            opens: 0,
            open_until: None,
            open_reason: None,
            probe_until: None,
            throttled_until: None,
            throttle_reason: None,
        }
    }

    /// The state after `signals` (in finishing order) at `now`. `breaker` is the destination's
    /// policy (`None`: it never opens).
    pub(in crate::relay) fn apply(
        mut self,
        signals: &[Signal],
        breaker: Option<&Breaker>,
        now: DateTime<Utc>,
    ) -> BreakerColumns {
        let after =
            |d: Duration| now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
        for signal in signals {
            match *signal {
                Signal::Delivered => {
                    // The throttle stands: a call that left before it may still be delivered.
                    self = BreakerColumns {
                        throttled_until: self.throttled_until,
                        throttle_reason: self.throttle_reason,
                        ..BreakerColumns::closed()
                    };
                }
                Signal::Inconclusive => {
                    if self.breaker == "half_open" {
                        self.probe_until = None;
                    }
                }
                Signal::Throttle {
                    wait,
                    throttled,
                    answers,
                } => {
                    let until = after(wait);
                    if self.throttled_until.is_none_or(|u| u < until) {
                        self.throttled_until = Some(until);
                        self.throttle_reason = Some(format!(
                            "the downstream throttled {throttled} of a relay's last {answers} \
                             calls and asked to wait {} (Retry-After)",
                            humanize(wait)
                        ));
                    }
                }
                Signal::Failed => {
                    self.failures = self.failures.saturating_add(1);
                    let Some(policy) = breaker else { continue };
                    let trips = match self.breaker {
                        "half_open" => true,
                        "closed" => {
                            self.failures >= i32::try_from(policy.failures).unwrap_or(i32::MAX)
                        }
                        _ => false,
                    };
                    if trips {
                        let probe = self.breaker == "half_open";
                        self.opens = self.opens.saturating_add(1);
                        let cool =
                            policy.cool_down_after(u32::try_from(self.opens).unwrap_or(u32::MAX));
                        self.breaker = "open";
                        self.open_until = Some(after(cool));
                        self.probe_until = None;
                        self.open_reason = Some(if probe {
                            format!("the probe failed; next probe in {}", humanize(cool))
                        } else {
                            format!(
                                "{} consecutive failures; next probe in {}",
                                self.failures,
                                humanize(cool)
                            )
                        });
                    }
                }
            }
        }
        self
    }
}

/// `1.5s`, `2m 30s`: a duration as an operator reads it.
pub(super) fn humanize(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        let text = format!("{secs:.1}");
        format!("{}s", text.trim_end_matches(".0"))
    } else {
        let whole = d.as_secs();
        match (whole / 60, whole % 60) {
            (m, 0) => format!("{m}m"),
            (m, s) => format!("{m}m {s}s"),
        }
    }
}
