//! A downstream's back-pressure against a real Postgres: a `Retry-After` on one row's answer
//! delays that row only, while a downstream that throttles most calls pauses the destination for
//! the time it asks, after which the flow ramps back up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txoutbox::relay::{DestinationPolicy, FlowControl, RetryPolicy, Semantics};
use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};
use txoutbox_test_support::factory::pending_many;
use txoutbox_test_support::relay::RunningRelay;
use txoutbox_test_support::test_db;

type TestResult = anyhow::Result<()>;

/// One call the downstream received.
#[derive(Debug, Clone)]
struct Call {
    key: String,
    start: Instant,
    end: Instant,
    /// The `Retry-After` it answered, if it throttled the call.
    throttled: Option<Duration>,
}

type Answer = dyn Fn(&str, usize) -> Option<Duration> + Send + Sync;

/// A downstream that answers each call after `latency`: 429 with the `Retry-After` that `answer`
/// gives (from the row's downstream key and how many calls came before), else 200. It records
/// every call.
#[derive(Clone)]
struct Downstream {
    answer: Arc<Answer>,
    latency: Duration,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Downstream {
    fn new(
        latency: Duration,
        answer: impl Fn(&str, usize) -> Option<Duration> + Send + Sync + 'static,
    ) -> Self {
        Self {
            answer: Arc::new(answer),
            latency,
            calls: Arc::default(),
        }
    }

    fn calls(&self) -> Vec<Call> {
        let mut calls = self.calls.lock().map(|c| c.clone()).unwrap_or_default();
        calls.sort_by_key(|c| c.start);
        calls
    }

    fn delivered(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.throttled.is_none())
            .count()
    }

    /// Waits until `n` calls were delivered, or `limit` passes; returns how many were.
    async fn wait_delivered(&self, n: usize, limit: Duration) -> usize {
        let start = Instant::now();
        while self.delivered() < n && start.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.delivered()
    }
}

#[async_trait::async_trait]
impl Sink for Downstream {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let start = Instant::now();
        let before = self.calls.lock().map(|c| c.len()).unwrap_or(0);
        let throttled = (self.answer)(&delivery.downstream_key, before);
        tokio::time::sleep(self.latency).await;
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(Call {
                key: delivery.downstream_key.clone(),
                start,
                end: Instant::now(),
                throttled,
            });
        }
        match throttled {
            Some(wait) => Err(DeliveryError::retry_after("429 Too Many Requests", wait)),
            None => Ok(Receipt::new("200")),
        }
    }
}

/// A policy with room for a `Retry-After` of a few seconds, at most `in_flight` calls at once.
fn policy(in_flight: usize) -> DestinationPolicy {
    DestinationPolicy {
        retry: RetryPolicy {
            base: Duration::from_millis(20),
            cap: Duration::from_secs(60),
            max_attempts: 20,
        },
        semantics: Semantics::AtLeastOnce,
        flow: FlowControl {
            max_in_flight: Some(in_flight),
            ..FlowControl::default()
        },
    }
}

#[tokio::test]
async fn one_rows_retry_after_delays_that_row_and_the_others_are_delivered_meanwhile() -> TestResult
{
    const WAIT: Duration = Duration::from_secs(3);
    let db = test_db().await?;
    let mut client = db.connect().await?;
    // The throttled row is the oldest: with one call at a time it is called first.
    pending_many(&mut client, "email", "busy-account", 1).await?;
    pending_many(&mut client, "email", "other", 10).await?;
    // The throttled row's first call answers 429; its second is delivered.
    let throttled_once = AtomicBool::new(false);
    let downstream = Downstream::new(Duration::ZERO, move |key, _| {
        (key == "busy-account-0" && !throttled_once.swap(true, Ordering::SeqCst)).then_some(WAIT)
    });
    let relay = RunningRelay::start(
        db.relay()?
            .sink("email", downstream.clone())
            .policy("email", policy(1))
            .build()?,
    );
    assert_eq!(
        downstream.wait_delivered(11, Duration::from_secs(30)).await,
        11
    );
    relay.stop().await?;
    let calls = downstream.calls();
    let throttled = calls
        .iter()
        .find(|c| c.throttled.is_some())
        .ok_or_else(|| anyhow::anyhow!("the row was never throttled: {calls:?}"))?;
    let due = throttled.end + WAIT;
    let others: Vec<&Call> = calls
        .iter()
        .filter(|c| c.key.starts_with("other"))
        .collect();
    assert_eq!(others.len(), 10, "each other row called once: {calls:?}");
    assert!(
        others.iter().all(|c| c.end < due),
        "the other rows waited for the throttled row's Retry-After: {calls:?}"
    );
    let again = calls
        .iter()
        .filter(|c| c.key == "busy-account-0")
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("the throttled row was not called again: {calls:?}"))?;
    assert!(
        again.start >= due,
        "the throttled row was called again {:?} after its 429, before its Retry-After of {WAIT:?}",
        again.start - throttled.end
    );
    Ok(())
}
