//! Relay helpers for tests: a recording sink, a scripted sink, a relay running in the background
//! with a handle to stop it, and test timings ([`relay_config`], [`short_lease`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio::sync::oneshot;
use txoutbox::{
    relay::{Relay, RelayReport},
    sink::{Delivery, DeliveryError, Receipt, Sink},
};

/// Records every delivery it is handed, and delivers.
#[derive(Debug, Clone, Default)]
pub struct RecordingSink {
    seen: Arc<Mutex<Vec<Delivery>>>,
}

impl RecordingSink {
    /// A sink that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every delivery so far, in call order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// The downstream key of every delivery so far, in call order.
    pub fn keys(&self) -> Vec<String> {
        self.deliveries()
            .into_iter()
            .map(|d| d.downstream_key)
            .collect()
    }

    /// How many calls so far.
    pub fn count(&self) -> usize {
        self.seen.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Waits until at least `n` calls were made, or `limit` passes; returns the count.
    pub async fn wait_for(&self, n: usize, limit: Duration) -> usize {
        let start = std::time::Instant::now();
        while self.count() < n && start.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.count()
    }
}

#[async_trait::async_trait]
impl Sink for RecordingSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(delivery.clone());
        }
        Ok(Receipt::new(format!("ok:{}", delivery.downstream_key)))
    }
}

/// Answers from a script, one answer per call (then delivers), and records the calls.
#[derive(Debug, Clone, Default)]
pub struct ScriptedSink {
    script: Arc<Mutex<VecDeque<Result<Receipt, DeliveryError>>>>,
    /// The calls made, as in [`RecordingSink`].
    pub recorder: RecordingSink,
}

impl ScriptedSink {
    /// A sink that answers `answers` in order, then delivers.
    pub fn new(answers: impl IntoIterator<Item = Result<Receipt, DeliveryError>>) -> Self {
        Self {
            script: Arc::new(Mutex::new(answers.into_iter().collect())),
            recorder: RecordingSink::new(),
        }
    }
}

#[async_trait::async_trait]
impl Sink for ScriptedSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let _ = self.recorder.deliver(delivery).await;
        let next = self.script.lock().ok().and_then(|mut s| s.pop_front());
        next.unwrap_or_else(|| Ok(Receipt::new("scripted")))
    }
}

/// A relay running on a task of the current runtime.
pub struct RunningRelay {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<txoutbox::Result<RelayReport>>,
}

impl RunningRelay {
    /// Starts `relay` in the background.
    pub fn start(relay: Relay) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(relay.run(async move {
            let _ = stopped.await;
        }));
        Self {
            stop: Some(stop),
            task,
        }
    }

    /// Asks the relay to stop gracefully and waits for its report.
    pub async fn stop(mut self) -> Result<RelayReport> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        Ok((&mut self.task).await??)
    }
}

impl Drop for RunningRelay {
    fn drop(&mut self) {
        // A relay dropped without stop() dies like a killed process: nothing more is written.
        self.task.abort();
    }
}

/// A relay on a runtime (and thread) of its own, that a test can kill like a process: dropping
/// the runtime stops every task at once, between any two statements, and writes nothing more.
pub struct CrashableRelay {
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<std::sync::mpsc::Receiver<txoutbox::Result<RelayReport>>>,
}

impl CrashableRelay {
    /// Builds and starts the relay on its own two-thread runtime.
    pub fn start(build: impl FnOnce() -> Result<Relay>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let relay = {
            let _guard = runtime.enter();
            build()?
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (report, done) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let result = relay
                .run(async move {
                    let _ = stopped.await;
                })
                .await;
            let _ = report.send(result);
        });
        Ok(Self {
            runtime: Some(runtime),
            stop: Some(stop),
            done: Some(done),
        })
    }

    /// Kills the relay: its runtime is dropped with everything in flight.
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Asks for a graceful stop and waits (blocking a helper thread) for the report.
    pub async fn stop(mut self) -> Result<RelayReport> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let done = self.done.take();
        let report = tokio::task::spawn_blocking(move || {
            done.map(|d| d.recv_timeout(Duration::from_secs(60)))
        })
        .await?;
        match report {
            Some(Ok(result)) => Ok(result?),
            _ => anyhow::bail!("the relay did not stop"),
        }
    }
}

impl Drop for CrashableRelay {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Wraps a real sink to crash "after the downstream got it, before the outcome was recorded": once
/// the inner sink has delivered, it signals and never answers, so the attempt is cut short by
/// whatever kills the relay. A failed delivery is returned as it is.
pub struct HangAfter<S> {
    inner: S,
    /// Notified once the inner sink has delivered.
    pub delivered: Arc<tokio::sync::Notify>,
}

impl<S: Sink> HangAfter<S> {
    /// Wraps `inner`, with a signal of its own.
    pub fn new(inner: S) -> Self {
        Self::with_signal(inner, Arc::new(tokio::sync::Notify::new()))
    }

    /// Wraps `inner`, notifying `delivered`.
    pub fn with_signal(inner: S, delivered: Arc<tokio::sync::Notify>) -> Self {
        Self { inner, delivered }
    }
}

#[async_trait::async_trait]
impl<S: Sink> Sink for HangAfter<S> {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        self.inner.deliver(delivery).await?;
        self.delivered.notify_one();
        std::future::pending().await
    }
}

/// Sleeps for its duration before delivering to its recording sink.
#[derive(Debug, Clone)]
pub struct SlowSink(pub RecordingSink, pub Duration);

#[async_trait::async_trait]
impl Sink for SlowSink {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        tokio::time::sleep(self.1).await;
        self.0.deliver(d).await
    }
}

/// Fails the row with one downstream key for good; records and delivers every other row.
#[derive(Debug, Clone)]
pub struct FailsKey {
    key: String,
    /// The deliveries of the other rows.
    pub delivered: RecordingSink,
}

impl FailsKey {
    /// A sink that fails the row with downstream key `key` with a permanent error.
    pub fn new(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            delivered: RecordingSink::new(),
        }
    }
}

#[async_trait::async_trait]
impl Sink for FailsKey {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        if d.downstream_key == self.key {
            return Err(DeliveryError::permanent("rejected"));
        }
        self.delivered.deliver(d).await
    }
}

/// A relay for a drain a Postgres restart lands in: small batches (16, as many in flight), a
/// lease of 2 s and a reclaim every 200 ms, so the rows held when the server went away come back
/// soon after it is up again.
pub fn restart_config() -> txoutbox::relay::RelayConfig {
    txoutbox::relay::RelayConfig::default()
        .with_concurrency(16)
        .with_batch_size(16)
        .with_lease(Duration::from_secs(2))
        .with_poll_interval(Duration::from_millis(50))
        .with_reclaim_interval(Duration::from_millis(200))
}

/// What a drain through a restart ended with: rows delivered, and the distinct downstream keys
/// the sink saw.
pub struct Drained {
    /// Rows in `txoutbox_delivered` when the wait ended.
    pub delivered: i64,
    /// Distinct downstream keys the sink was called with.
    pub distinct_keys: usize,
}

/// Lets `relay` drain into `sink` until the sink has seen `before` calls, restarts `cluster`
/// with an immediate stop (as a crash), then waits (90 s at most) until `total` rows are in
/// `txoutbox_delivered`, and stops the relay.
pub async fn drain_through_a_restart(
    cluster: &crate::Cluster,
    db: &crate::TestDb,
    relay: RunningRelay,
    sink: &RecordingSink,
    before: usize,
    total: i64,
) -> Result<Drained> {
    sink.wait_for(before, Duration::from_secs(30)).await;
    cluster.restart()?;
    let client = db.connect().await?;
    let delivered = crate::wait_for_count(
        &client,
        "SELECT count(*) FROM txoutbox_delivered",
        total,
        Duration::from_secs(90),
    )
    .await?;
    relay.stop().await?;
    let mut keys = sink.keys();
    keys.sort();
    keys.dedup();
    Ok(Drained {
        delivered,
        distinct_keys: keys.len(),
    })
}

/// Test-friendly relay timings: poll every 50 ms, reclaim expired leases every 100 ms (what
/// [`TestDb::relay`](crate::TestDb::relay) starts from).
pub fn relay_config() -> txoutbox::relay::RelayConfig {
    txoutbox::relay::RelayConfig::default()
        .with_poll_interval(Duration::from_millis(50))
        .with_reclaim_interval(Duration::from_millis(100))
}

/// [`relay_config`] with a lease of 1 s, for tests where a lease expires.
pub fn short_lease() -> txoutbox::relay::RelayConfig {
    relay_config().with_lease(Duration::from_secs(1))
}

/// A retry policy for tests: 20 ms to 100 ms between attempts, at most `max_attempts`.
pub fn quick_retry(max_attempts: u32) -> txoutbox::relay::DestinationPolicy {
    txoutbox::relay::DestinationPolicy {
        retry: txoutbox::relay::RetryPolicy {
            base: Duration::from_millis(20),
            cap: Duration::from_millis(100),
            max_attempts,
        },
        semantics: txoutbox::relay::Semantics::AtLeastOnce,
        ..Default::default()
    }
}

/// The rule every sink meets at a relay's build (which connects to nothing): under a 10 s
/// lease, `slow` (a sink whose timeout is 20 s, the `what` of the failure message) is refused
/// in one line naming the lease, `destination` and the timeout; `fitting` (a shorter timeout)
/// is accepted.
pub fn assert_lease_must_hold_the_timeout(
    destination: &str,
    what: &str,
    slow: impl Sink,
    fitting: impl Sink,
) -> Result<()> {
    let pg: tokio_postgres::Config = "host=127.0.0.1 user=postgres".parse()?;
    let ten_seconds = txoutbox::relay::RelayConfig::default().with_lease(Duration::from_secs(10));
    let refused = Relay::builder(pg.clone())
        .config(ten_seconds.clone())
        .sink(destination, slow)
        .build();
    let Err(txoutbox::Error::Config(line)) = refused else {
        anyhow::bail!("a 10 s lease with a 20 s {what} was accepted");
    };
    assert!(
        line.starts_with("lease: 10s")
            && line.contains(&format!("\"{destination}\""))
            && line.contains("20s")
            && !line.contains('\n'),
        "{line}"
    );
    assert!(
        Relay::builder(pg)
            .config(ten_seconds)
            .sink(destination, fitting)
            .build()
            .is_ok(),
        "a timeout shorter than the lease fits"
    );
    Ok(())
}

/// The hostile-row case every sink crate meets: a payload `raw` of the wrong shape, stored as
/// another program would write it (under downstream key `raw-1`), which the sink crate's
/// `check` refuses (asserted here first), is failed at its first attempt by a relay delivering
/// `destination` to `sink` (asserted: exactly one failed row). Gives back the row's
/// `last_error`, for the test to check that it names the payload's builder.
pub async fn fail_raw_payload<E>(
    db: &crate::TestDb,
    destination: &str,
    raw: &serde_json::Value,
    check: impl FnOnce(&serde_json::Value) -> std::result::Result<(), E>,
    sink: impl Sink,
) -> Result<String> {
    assert!(check(raw).is_err(), "check refuses it first");
    let mut client = db.connect().await?;
    let row = txoutbox::OutboxMessage::new(destination, raw)?.with_downstream_key("raw-1");
    crate::request::enqueue_committed(&mut client, &[row]).await?;
    let relay = RunningRelay::start(db.relay()?.sink(destination, sink).build()?);
    assert_eq!(
        crate::wait_until(&client, |c| c.failed >= 1).await?.failed,
        1
    );
    relay.stop().await?;
    crate::select::value(&client, "SELECT last_error FROM txoutbox_messages").await
}
