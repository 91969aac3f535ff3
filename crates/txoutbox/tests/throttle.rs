//! A downstream's back-pressure against a real Postgres: a `Retry-After` on one row's answer
//! delays that row only, while a downstream that throttles most calls pauses the destination for
//! the time it asks, after which the flow ramps back up.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txoutbox::relay::{DestinationPolicy, FlowControl, RetryPolicy, Semantics};
use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};
use txoutbox_test_support::factory::db_with_pending;
use txoutbox_test_support::factory::pending_many;
use txoutbox_test_support::relay::RunningRelay;
use txoutbox_test_support::{eventually, test_db_with_client, TestDb};

type TestResult = anyhow::Result<()>;

/// One call the downstream received.
#[derive(Debug, Clone)]
struct Call {
    key: String,
    start: Instant,
    end: Instant,
    /// The `Retry-After` it answered, if it throttled the call.
    throttled: Option<Duration>,
    /// Calls in flight at the downstream when this one arrived (itself included).
    in_flight: usize,
}

type Answer = dyn Fn(&str, usize) -> Option<Duration> + Send + Sync;

/// A downstream that answers each call after `latency`: 429 with the `Retry-After` that `answer`
/// gives (from the row's downstream key and how many calls came before), else 200. It records
/// every call, and how many were in flight at once.
#[derive(Clone)]
struct Downstream {
    answer: Arc<Answer>,
    latency: Duration,
    calls: Arc<Mutex<Vec<Call>>>,
    in_flight: Arc<Mutex<usize>>,
    started: Arc<AtomicUsize>,
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
            in_flight: Arc::default(),
            started: Arc::default(),
        }
    }

    /// Calls started so far.
    fn started(&self) -> usize {
        self.started.fetch_add(1, Ordering::SeqCst)
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
        let enough = eventually("calls delivered", || self.delivered() >= n);
        let _ = tokio::time::timeout(limit, enough).await;
        self.delivered()
    }
}

#[async_trait::async_trait]
impl Sink for Downstream {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let start = Instant::now();
        let (before, in_flight) = {
            let mut n = self.in_flight.lock().map_err(|_| poisoned())?;
            *n += 1;
            (self.started(), *n)
        };
        let throttled = (self.answer)(&delivery.downstream_key, before);
        tokio::time::sleep(self.latency).await;
        if let Ok(mut n) = self.in_flight.lock() {
            *n -= 1;
        }
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(Call {
                key: delivery.downstream_key.clone(),
                start,
                end: Instant::now(),
                throttled,
                in_flight,
            });
        }
        match throttled {
            Some(wait) => Err(DeliveryError::retry_after("429 Too Many Requests", wait)),
            None => Ok(Receipt::new("200")),
        }
    }
}

/// A policy with room for a `Retry-After` of a few seconds, at most `in_flight` calls at once.
fn poisoned() -> DeliveryError {
    DeliveryError::retryable("the test downstream's lock was poisoned")
}

/// The pauses in `calls` (sorted by start): the indexes of the calls that started at least
/// `silence` after every call before them had ended.
fn pauses(calls: &[Call], silence: Duration) -> Vec<usize> {
    let mut ended: Option<Instant> = None;
    let mut out = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        if ended.is_some_and(|e| call.start >= e + silence) {
            out.push(i);
        }
        ended = Some(ended.map_or(call.end, |e| e.max(call.end)));
    }
    out
}

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

/// Runs a relay delivering `email` rows to `downstream` under `policy` until `rows` calls were
/// delivered (60 s at most), stops it, and returns the calls in the order they began.
async fn drain(
    db: &TestDb,
    downstream: &Downstream,
    policy: DestinationPolicy,
    rows: usize,
) -> anyhow::Result<Vec<Call>> {
    let relay = RunningRelay::start(
        db.relay()?
            .sink("email", downstream.clone())
            .policy("email", policy)
            .build()?,
    );
    let delivered = downstream
        .wait_delivered(rows, Duration::from_secs(60))
        .await;
    relay.stop().await?;
    anyhow::ensure!(delivered == rows, "{delivered} of {rows} rows delivered");
    Ok(downstream.calls())
}

#[tokio::test]
async fn one_rows_retry_after_delays_that_row_and_the_others_are_delivered_meanwhile() -> TestResult
{
    const WAIT: Duration = Duration::from_secs(3);
    let (db, mut client) = test_db_with_client().await?;
    // The throttled row is the oldest: with one call at a time it is called first.
    pending_many(&mut client, "email", "busy-account", 1).await?;
    pending_many(&mut client, "email", "other", 10).await?;
    // The throttled row's first call answers 429; its second is delivered.
    let throttled_once = AtomicBool::new(false);
    let downstream = Downstream::new(Duration::ZERO, move |key, _| {
        (key == "busy-account-0" && !throttled_once.swap(true, Ordering::SeqCst)).then_some(WAIT)
    });
    let calls = drain(&db, &downstream, policy(1), 11).await?;
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

#[tokio::test]
async fn a_downstream_throttling_most_calls_pauses_the_destination_for_its_retry_after(
) -> TestResult {
    const WAIT: Duration = Duration::from_secs(3);
    let (db, _client) = db_with_pending("email", "row", 30).await?;
    // Every call 429s (Retry-After: 3) until six have, then every call is delivered.
    let downstream = Downstream::new(Duration::ZERO, |_, n| (n < 6).then_some(WAIT));
    let calls = drain(&db, &downstream, policy(1), 30).await?;
    // A silence of the whole Retry-After (less a clock's slack) while rows were due: the
    // destination paused, and not before several answers had asked it to.
    let paused = pauses(&calls, WAIT - Duration::from_millis(50));
    let first = *paused
        .first()
        .ok_or_else(|| anyhow::anyhow!("the destination never paused: {calls:?}"))?;
    assert!(
        first > 1 && calls[..first].iter().all(|c| c.throttled.is_some()),
        "paused after {first} calls, not when most calls were throttled: {calls:?}"
    );
    Ok(())
}

#[tokio::test]
async fn after_a_pause_the_calls_ramp_back_up_more_than_one_at_a_time() -> TestResult {
    const WAIT: Duration = Duration::from_secs(1);
    let (db, _client) = db_with_pending("email", "row", 80).await?;
    // Every call 429s (Retry-After: 1) until 16 have, then every call is delivered; each
    // call takes 100 ms, so the calls of one claim are in flight together.
    let downstream = Downstream::new(Duration::from_millis(100), |_, n| (n < 16).then_some(WAIT));
    let calls = drain(&db, &downstream, policy(8), 80).await?;
    let paused = pauses(&calls, WAIT - Duration::from_millis(50));
    let first = *paused
        .first()
        .ok_or_else(|| anyhow::anyhow!("the destination never paused: {calls:?}"))?;
    // Between the end of the first pause and the next one (or the end), calls overlap: the
    // flow comes back more than one call at a time, not one probe per pause.
    let next = paused.get(1).copied().unwrap_or(calls.len());
    let after = &calls[first..next];
    let most = after.iter().map(|c| c.in_flight).max().unwrap_or(0);
    assert!(
        most > 1,
        "one call at a time after the pause until the next: {after:?}"
    );
    // It ramps: the calls that left before the first call after the last pause ended are two
    // (not the destination's limit of 8), and the deliveries widen the window up to the limit.
    let last = *paused.last().unwrap_or(&first);
    let first_end = calls[last].end;
    let together = calls[last..].iter().filter(|c| c.start < first_end).count();
    assert!(
        together <= 2,
        "{together} calls came back at once after the pause: {:?}",
        &calls[last..]
    );
    assert_eq!(
        calls[last..].iter().map(|c| c.in_flight).max(),
        Some(8),
        "the ramp never reached the destination's limit: {:?}",
        &calls[last..]
    );
    Ok(())
}
