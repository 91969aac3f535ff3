//! Commit → sink latency at a steady offered load, the relay at its defaults (and a peer beside
//! it with `--peer`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use txoutbox::{
    relay::{Relay, RelayConfig, RelayWaker},
    sink::{Delivery, DeliveryError, Receipt, Sink},
    OutboxMessage,
};
use txoutbox_test_support::{ConnInfo, TestDb};

/// Options of `txoutbox-bench latency`.
#[derive(Debug, clap::Args)]
pub struct LatencyArgs {
    /// Offered load, messages per second (one transaction each).
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Seconds of load.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Each message is the effect of an idempotent request in a scope with deferred effects
    /// (`begin`, `Claim::commit`): the latency includes the relay's fan-out. Without it, each is
    /// written with `txoutbox::enqueue`.
    #[arg(long)]
    pub deferred: bool,
    /// Also measure a peer at the same rate on the same server, alternately with the relay
    /// (`--rounds` times each); prints both.
    #[arg(long, value_enum)]
    pub peer: Option<crate::peer::Peer>,
    /// Rounds of the side-by-side comparison with `--peer` (relay, peer, relay, peer, …).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
}

/// Measures commit → sink latency of the relay at its defaults at `args.rate` for
/// `args.seconds`.
pub(crate) async fn measure(db: &TestDb, args: &LatencyArgs) -> Result<Latency> {
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
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
        let deferred = args.deferred;
        producers.spawn(async move {
            let key = commit_one(&pool, i, deferred).await?;
            // Registered as the commit returns; a message delivered before is not timed.
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
    Ok(Latency {
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        timed: l.len() as u64,
        sent: total,
    })
}

/// A sink that times each delivery from the commit its producer registered.
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

/// Commits message `i` (through a deferred-effects claim with `deferred`, else enqueued with a
/// key of its own) and returns its downstream key.
async fn commit_one(pool: &deadpool_postgres::Pool, i: u64, deferred: bool) -> Result<String> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let message = OutboxMessage::new("timed", &serde_json::json!({ "i": i }))?;
    if deferred {
        let scope = txoutbox::Scope::new("latency")?.with_deferred_effects();
        let request = txoutbox::IdempotencyKey::parse(&uuid::Uuid::now_v7().to_string())?;
        let fingerprint = txoutbox::Fingerprint::new("POST", "/timed", b"{}");
        let txoutbox::Begin::New(mut claim) =
            txoutbox::begin(&tx, &scope, &request, &fingerprint).await?
        else {
            anyhow::bail!("a fresh key was not new");
        };
        let key = claim.downstream_key("timed");
        claim.enqueue("timed", message)?;
        let response = txoutbox::StoredResponse {
            status: 202,
            headers: vec![],
            body: vec![],
        };
        claim.commit(tx, &response).await?;
        Ok(key)
    } else {
        let key = format!("lat-{i}");
        txoutbox::enqueue(&tx, &[message.with_downstream_key(key.clone())]).await?;
        tx.commit().await?;
        Ok(key)
    }
}

/// Commit → sink latency percentiles of one run.
pub(crate) struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub timed: u64,
    pub sent: u64,
}

pub async fn run(db: &TestDb, admin: &ConnInfo, args: &LatencyArgs) -> Result<()> {
    println!(
        "txoutbox-bench latency: {} msg/s offered for {}s, one transaction each{}, hint after commit",
        args.rate,
        args.seconds,
        if args.deferred {
            " (a request with deferred effects)"
        } else {
            ""
        }
    );
    if let Some(peer) = args.peer {
        return crate::peer::compare_latency(peer, db, admin, args).await;
    }
    let l = measure(db, args).await?;
    println!(
        "timed {} of {} messages (a message delivered before its commit returned is not timed)",
        l.timed, l.sent
    );
    println!("p50_ms: {:.2} p99_ms: {:.2}", l.p50_ms, l.p99_ms);
    Ok(())
}
