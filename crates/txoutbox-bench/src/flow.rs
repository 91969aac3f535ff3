//! `txoutbox-bench flow`: a backlog of `--rows` webhook rows to a loopback downstream that takes
//! `--limit` calls a second (a token bucket of its own) and answers 429 with `Retry-After: 1`
//! beyond, drained twice on the same database: with no flow control configured (the baseline),
//! and with the relay's rate limit set to the downstream's. Reports attempts per delivered row
//! and the time to drain.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use txoutbox::{
    relay::{DestinationPolicy, FlowControl, RateLimit, RelayConfig},
    OutboxMessage,
};
use txoutbox_test_support::relay::RunningRelay;
use txoutbox_test_support::TestDb;

/// Options of `txoutbox-bench flow`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rows in the backlog.
    #[arg(long, default_value_t = 10_000)]
    rows: usize,
    /// Calls a second the downstream takes.
    #[arg(long, default_value_t = 100.0)]
    limit: f64,
}

const DESTINATION: &str = "webhook:limited";
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// The downstream: a token bucket of `limit` a second (bursts of a tenth of a second's worth).
#[derive(Clone)]
struct Downstream {
    bucket: Arc<Mutex<(f64, Instant)>>,
    limit: f64,
    accepted: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

impl Downstream {
    fn burst(&self) -> f64 {
        (self.limit / 10.0).max(1.0)
    }

    fn take(&self) -> bool {
        let Ok(mut bucket) = self.bucket.lock() else {
            return false;
        };
        let now = Instant::now();
        let refill = (now - bucket.1).as_secs_f64() * self.limit;
        bucket.0 = (bucket.0 + refill).min(self.burst());
        bucket.1 = now;
        if bucket.0 >= 1.0 {
            bucket.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

async fn receive(axum::extract::State(down): axum::extract::State<Downstream>) -> Response {
    if down.take() {
        down.accepted.fetch_add(1, Ordering::Relaxed);
        StatusCode::OK.into_response()
    } else {
        down.refused.fetch_add(1, Ordering::Relaxed);
        let mut response = StatusCode::TOO_MANY_REQUESTS.into_response();
        response
            .headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
        response
    }
}

/// One drain's figures.
struct Drain {
    seconds: f64,
    calls: u64,
    refused: u64,
    delivered: i64,
}

pub async fn run(db: &TestDb, args: &Args) -> Result<()> {
    anyhow::ensure!(
        args.limit > 0.0 && args.rows > 0,
        "--rows and --limit must be above 0"
    );
    println!(
        "flow: {} rows to a downstream that takes {}/s (429, Retry-After: 1 beyond)",
        args.rows, args.limit
    );
    let baseline = drain(db, args, None).await?;
    let limited = drain(db, args, Some(RateLimit::per_second(args.limit))).await?;
    let ideal = args.rows as f64 / args.limit;
    println!("| relay | delivered | calls | 429s | attempts per row | drain | vs rows/limit |");
    println!("|---|---|---|---|---|---|---|");
    for (label, d) in [
        ("no flow control configured", &baseline),
        (
            &*format!("--rate-limit {DESTINATION}={}/s", args.limit),
            &limited,
        ),
    ] {
        println!(
            "| {label} | {} | {} | {} | {:.3} | {:.1} s | {:.2}x |",
            d.delivered,
            d.calls,
            d.refused,
            d.calls as f64 / d.delivered.max(1) as f64,
            d.seconds,
            d.seconds / ideal
        );
    }
    println!(
        "attempts per row, rate limit vs none: {:.3} vs {:.3} (goal <= 1.05); drain {:.1} s for an ideal {:.1} s",
        limited.calls as f64 / limited.delivered.max(1) as f64,
        baseline.calls as f64 / baseline.delivered.max(1) as f64,
        limited.seconds,
        ideal
    );
    println!(
        "command: cargo run --release -p txoutbox-bench -- flow --rows {} --limit {}",
        args.rows, args.limit
    );
    Ok(())
}

async fn drain(db: &TestDb, args: &Args, rate: Option<RateLimit>) -> Result<Drain> {
    let mut client = db.connect().await?;
    client
        .batch_execute(
            "TRUNCATE txoutbox_messages, txoutbox_delivered, txoutbox_attempt_log, \
             txoutbox_destinations",
        )
        .await?;
    let down = Downstream {
        bucket: Arc::new(Mutex::new((0.0, Instant::now()))),
        limit: args.limit,
        accepted: Arc::default(),
        refused: Arc::default(),
    };
    let router = axum::Router::new()
        .route("/", axum::routing::post(receive))
        .with_state(down.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    for chunk in (0..args.rows).collect::<Vec<_>>().chunks(1000) {
        let tx = client.transaction().await?;
        let messages = chunk
            .iter()
            .map(|i| {
                OutboxMessage::new(
                    DESTINATION,
                    &serde_json::json!({ "event_type": "bench.event", "data": { "n": i } }),
                )
                .map(|m| m.with_downstream_key(format!("flow-{i}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        txoutbox::enqueue(&tx, &messages).await?;
        tx.commit().await?;
    }
    let secret = txoutbox_webhook::WebhookSecret::parse(SECRET)?;
    let sink = txoutbox_webhook::WebhookSink::new(&format!("http://{addr}/"), secret)
        .context("the bench's webhook sink")?;
    let started = Instant::now();
    let relay = RunningRelay::start(
        db.relay()?
            .config(RelayConfig::default().with_poll_interval(Duration::from_millis(100)))
            .sink(DESTINATION, sink)
            .policy(
                DESTINATION,
                DestinationPolicy {
                    flow: FlowControl {
                        rate_limit: rate,
                        ..FlowControl::default()
                    },
                    ..DestinationPolicy::default()
                },
            )
            .build()?,
    );
    // The baseline may never drain: it is given twice the ideal time (and 10 s).
    let limit = Duration::from_secs_f64(args.rows as f64 / args.limit * 2.0 + 10.0);
    let delivered = loop {
        let n: i64 = client
            .query_one("SELECT count(*) FROM txoutbox_delivered", &[])
            .await?
            .get(0);
        if n as usize >= args.rows || started.elapsed() > limit {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    relay.stop().await?;
    server.abort();
    let refused = down.refused.load(Ordering::Relaxed);
    Ok(Drain {
        seconds,
        calls: down.accepted.load(Ordering::Relaxed) + refused,
        refused,
        delivered,
    })
}
