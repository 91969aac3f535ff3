//! The relay benchmarks: drain throughput against a raw-SQL drain loop on the same backlog,
//! commit→sink latency at a steady offered load, and the claim rate with and without history.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use txoutbox::{
    relay::{Relay, RelayConfig, RelayWaker},
    sink::{Delivery, DeliveryError, Receipt, Sink},
    OutboxMessage,
};
use txoutbox_test_support::TestDb;

/// Options of `txoutbox-bench relay`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Backlog size.
    #[arg(long, default_value_t = 100_000)]
    rows: i64,
    /// Rows per claim, for both the raw drain and the relay.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Rows of delivered history to add for the claim-cost comparison (0 skips it).
    #[arg(long, default_value_t = 10_000_000)]
    history: i64,
    /// Run the relay's statements unnamed (as behind PgBouncer) instead of prepared.
    #[arg(long)]
    unprepared: bool,
}

/// Options of `txoutbox-bench latency`.
#[derive(Debug, clap::Args)]
pub struct LatencyArgs {
    /// Offered load, messages per second (one transaction each).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Seconds of load.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

/// Counts calls and does nothing else.
#[derive(Clone, Default)]
struct NoopSink(Arc<AtomicU64>);

#[async_trait::async_trait]
impl Sink for NoopSink {
    async fn deliver(&self, _: &Delivery) -> Result<Receipt, DeliveryError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(Receipt::none())
    }
}

const RAW_CLAIM: &str = "WITH c AS (SELECT id FROM txoutbox_messages \
     WHERE status = 'pending' AND next_attempt_at <= now() ORDER BY next_attempt_at \
     LIMIT $1 FOR UPDATE SKIP LOCKED) \
     UPDATE txoutbox_messages m SET status = 'in_flight', \
         lease_token = nextval('txoutbox_lease_token_seq') \
     FROM c WHERE m.id = c.id RETURNING m.id";
const RAW_DONE: &str = "DELETE FROM txoutbox_messages WHERE id = ANY($1)";

async fn fill(client: &tokio_postgres::Client, rows: i64) -> Result<()> {
    client
        .execute(
            "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key) \
             SELECT gen_random_uuid(), 'noop', '{\"n\": 1}', 'k-' || g \
             FROM generate_series(1, $1::bigint) g",
            &[&rows],
        )
        .await?;
    client
        .batch_execute("VACUUM ANALYZE txoutbox_messages")
        .await?;
    Ok(())
}

/// Drains the backlog with hand-written SQL on one connection; returns rows/s.
async fn raw_drain(client: &tokio_postgres::Client, batch: usize, rows: i64) -> Result<f64> {
    let claim = client.prepare(RAW_CLAIM).await?;
    let done = client.prepare(RAW_DONE).await?;
    let limit = batch as i64;
    let start = Instant::now();
    let mut drained = 0i64;
    loop {
        let ids: Vec<uuid::Uuid> = client
            .query(&claim, &[&limit])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if ids.is_empty() {
            break;
        }
        drained += ids.len() as i64;
        client.execute(&done, &[&ids]).await?;
    }
    anyhow::ensure!(drained == rows, "raw drain saw {drained} of {rows} rows");
    Ok(rows as f64 / start.elapsed().as_secs_f64())
}

/// Drains the backlog with the relay and a no-op sink; returns rows/s.
async fn relay_drain(db: &TestDb, batch: usize, rows: i64, prepared: bool) -> Result<f64> {
    let sink = NoopSink::default();
    let relay = Relay::builder(db.config()?)
        .config(RelayConfig {
            batch_size: batch,
            concurrency: batch * 4,
            poll_interval: Duration::from_millis(50),
            prepared_statements: prepared,
            ..RelayConfig::default()
        })
        .sink("noop", sink.clone())
        .build()?;
    let observer = db.connect().await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let start = Instant::now();
    let running = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    while (sink.0.load(Ordering::Relaxed) as i64) < rows {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every call is made; wait for the last completions to commit.
    loop {
        let left: i64 = observer
            .query_one("SELECT count(*) FROM txoutbox_messages", &[])
            .await?
            .get(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let _ = stop.send(());
    running.await??;
    Ok(rows as f64 / elapsed)
}

/// Claim statements per second (raw claim of `batch`, released again) over a fixed backlog.
async fn claim_rate(client: &tokio_postgres::Client, batch: usize) -> Result<f64> {
    let claim = client.prepare(RAW_CLAIM).await?;
    let limit = batch as i64;
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(5) {
        client.batch_execute("BEGIN").await?;
        client.query(&claim, &[&limit]).await?;
        client.batch_execute("ROLLBACK").await?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

pub async fn run_drain(db: &TestDb, args: &DrainArgs) -> Result<()> {
    let client = db.connect().await?;
    println!(
        "txoutbox-bench relay: backlog {} rows, batch {}, same database, same run",
        args.rows, args.batch
    );
    fill(&client, args.rows).await?;
    let raw = raw_drain(&client, args.batch, args.rows).await?;
    println!("(a) raw SQL drain (claim SKIP LOCKED + delete, 1 connection): {raw:>9.0} rows/s");
    client
        .batch_execute("TRUNCATE txoutbox_delivered, txoutbox_attempts; CHECKPOINT")
        .await?;
    fill(&client, args.rows).await?;
    let relay = relay_drain(db, args.batch, args.rows, !args.unprepared).await?;
    println!("(b) relay, no-op sink (claim, deliver, fenced completion):   {relay:>9.0} rows/s");
    if args.history > 0 {
        client
            .batch_execute("TRUNCATE txoutbox_delivered, txoutbox_attempts")
            .await?;
        fill(&client, 100_000).await?;
        let bare = claim_rate(&client, args.batch).await?;
        client
            .execute(
                "INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, \
                 downstream_key, attempts, created_at, delivered_at) \
                 SELECT gen_random_uuid(), g, 'noop', '{\"n\": 1}', '{}', 'h-' || g, 1, \
                 now() - interval '1 day', now() - interval '1 day' \
                 FROM generate_series(1, $1::bigint) g",
                &[&args.history],
            )
            .await?;
        client.batch_execute("VACUUM ANALYZE").await?;
        let with_history = claim_rate(&client, args.batch).await?;
        println!(
            "claim rate over a 100000-row backlog: {bare:.0}/s with no history, \
             {with_history:.0}/s with {} delivered rows: {:.2}x",
            args.history,
            bare / with_history
        );
    }
    println!("ratio: {:.2}", relay / raw);
    Ok(())
}

pub async fn run_latency(db: &TestDb, args: &LatencyArgs) -> Result<()> {
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    #[derive(Clone)]
    struct Timing {
        committed: Arc<Mutex<HashMap<String, Instant>>>,
        latencies: Arc<Mutex<Vec<f64>>>,
    }
    #[async_trait::async_trait]
    impl Sink for Timing {
        async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
            let now = Instant::now();
            let at = self
                .committed
                .lock()
                .ok()
                .and_then(|mut m| m.remove(&d.downstream_key));
            if let (Some(at), Ok(mut l)) = (at, self.latencies.lock()) {
                l.push(now.saturating_duration_since(at).as_secs_f64() * 1000.0);
            }
            Ok(Receipt::none())
        }
    }
    let relay = Relay::builder(db.config()?)
        .config(RelayConfig::default())
        .sink(
            "timed",
            Timing {
                committed: committed.clone(),
                latencies: latencies.clone(),
            },
        )
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pool = db.pool(8)?;
    let waker = RelayWaker::spawn(pool.clone());
    let total = args.rate * args.seconds;
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut producers = tokio::task::JoinSet::new();
    for i in 0..total {
        ticker.tick().await;
        let (pool, waker, committed) = (pool.clone(), waker.clone(), committed.clone());
        producers.spawn(async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            let key = format!("lat-{i}");
            let message = OutboxMessage::new("timed", &serde_json::json!({ "i": i }))?
                .with_downstream_key(key.clone());
            txoutbox::enqueue(&tx, &[message]).await?;
            // Register the key before the commit returns, so the sink never misses it.
            tx.commit().await?;
            if let Ok(mut m) = committed.lock() {
                m.insert(key, Instant::now());
            }
            waker.wake();
            anyhow::Ok(())
        });
        while producers.try_join_next().is_some() {}
    }
    while let Some(r) = producers.join_next().await {
        r??;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = stop.send(());
    running.await??;
    let mut l = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    l.sort_by(f64::total_cmp);
    anyhow::ensure!(!l.is_empty(), "no message timed");
    let pct = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)];
    println!(
        "txoutbox-bench latency: {} msg/s offered for {}s, one transaction each, hint after commit",
        args.rate, args.seconds
    );
    println!(
        "timed {} of {} messages (a message delivered before its commit returned is not timed)",
        l.len(),
        total
    );
    println!("p50_ms: {:.2} p99_ms: {:.2}", pct(0.50), pct(0.99));
    Ok(())
}
