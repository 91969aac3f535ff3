//! The dashboard benchmark: every page and API answer timed over real HTTP against a database
//! filled with `--pending` hot rows (some failed) and `--delivered` history rows, reported as
//! p50/p99 per page. The target is under 200 ms each with 1 M pending and 10 M delivered.

use std::time::{Duration, Instant};

use anyhow::Result;
use txoutbox_test_support::TestDb;

/// Options of `txoutbox-bench dashboard`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Hot rows (pending; one in a hundred failed).
    #[arg(long, default_value_t = 100_000)]
    pending: u64,
    /// Delivered rows in the history table.
    #[arg(long, default_value_t = 1_000_000)]
    delivered: u64,
    /// Requests per page.
    #[arg(long, default_value_t = 30)]
    requests: usize,
}

/// Fills the tables with plain SQL (the write path is not what is measured here): hot rows
/// spread over the last day, the delivered history over the last week in delivery order (as the
/// relay appends it), ten destinations, an attempt per failed row and per recent delivery.
const FILL: &str = "
INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, ordering_key, status,
    attempts, last_error, created_at)
SELECT gen_random_uuid(), 'dest-' || (i % 10), jsonb_build_object('n', i, 'email', 'c' || i || '@example.com'),
    'hot-' || i, CASE WHEN i % 3 = 0 THEN 'order-' || (i % 1000) END,
    CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'pending' END, (i % 100 = 0)::int,
    CASE WHEN i % 100 = 0 THEN '402 card declined for charge ' || i END,
    now() - make_interval(secs => ($1::int8 - i) * 86400.0 / $1::int8)
FROM generate_series(1, $1::int8) AS i;
";

const FILL_DELIVERED: &str = "
INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, downstream_key, attempts,
    created_at, delivered_at, receipt)
SELECT gen_random_uuid(), 1000000000 + i, 'dest-' || (i % 10), jsonb_build_object('n', i), '{}',
    'old-' || i, 1, now() - make_interval(secs => ($1::int8 - i) * 604800.0 / $1::int8 + 1),
    now() - make_interval(secs => ($1::int8 - i) * 604800.0 / $1::int8), 'ok'
FROM generate_series(1, $1::int8) AS i;
";

const FILL_ATTEMPTS: &str = "
INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, relay, outcome,
    error, started_at, finished_at)
SELECT id, destination, 1, downstream_key, 'bench', 'failed', last_error, created_at, created_at
FROM txoutbox_messages WHERE status = 'failed'
UNION ALL
SELECT id, destination, 1, downstream_key, 'bench', 'delivered', NULL, delivered_at, delivered_at
FROM txoutbox_delivered WHERE delivered_at > now() - interval '1 hour';
";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub async fn run(db: &TestDb, args: &Args) -> Result<()> {
    let client = db.connect().await?;
    println!(
        "txoutbox-bench dashboard: {} hot rows ({} failed), {} delivered, {} requests per page",
        args.pending,
        args.pending / 100,
        args.delivered,
        args.requests
    );
    let (failed, cursor) = fill(&client, args).await?;

    // Without redacted fields: with them, the error-text search (measured below) is refused.
    let app =
        txoutbox_dashboard::router(db.pool(4)?, txoutbox_dashboard::DashboardConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;

    let pages = [
        ("overview", "/".to_owned()),
        ("messages", "/messages".to_owned()),
        ("messages, failed", "/messages?status=failed".to_owned()),
        (
            "messages, destination",
            "/messages?destination=dest-3".to_owned(),
        ),
        (
            "messages, page 11",
            format!("/messages?before={}.{}", cursor.0, cursor.1),
        ),
        (
            "messages, error text",
            "/messages?error=declined".to_owned(),
        ),
        ("message", format!("/messages/{failed}")),
        ("failures", "/failures".to_owned()),
        ("keys (miss)", "/keys?scope=charges&key=nope".to_owned()),
        ("api stats", "/api/stats".to_owned()),
        (
            "api messages, failed",
            "/api/messages?status=failed&limit=50".to_owned(),
        ),
        ("api message", format!("/api/messages/{failed}")),
    ];
    println!("{:<24} {:>10} {:>10}", "page", "p50 ms", "p99 ms");
    for (name, path) in &pages {
        let mut times = page_times(&http, &format!("{base}{path}"), args.requests).await?;
        times.sort();
        println!(
            "{:<24} {:>10.1} {:>10.1}",
            name,
            percentile(&times, 0.5).as_secs_f64() * 1e3,
            percentile(&times, 0.99).as_secs_f64() * 1e3
        );
    }
    server.abort();
    Ok(())
}

/// Fills the tables (hot rows, the history, the attempt log) and answers a failed row's id and
/// a cursor 500 rows down the list.
async fn fill(client: &tokio_postgres::Client, args: &Args) -> Result<(uuid::Uuid, (i64, i64))> {
    let started = Instant::now();
    client
        .execute(FILL, &[&i64::try_from(args.pending)?])
        .await?;
    client
        .execute(FILL_DELIVERED, &[&i64::try_from(args.delivered)?])
        .await?;
    client.execute(FILL_ATTEMPTS, &[]).await?;
    client
        .batch_execute("VACUUM ANALYZE txoutbox_messages, txoutbox_delivered, txoutbox_attempt_log")
        .await?;
    println!("filled in {:.1} s", started.elapsed().as_secs_f64());

    let failed: uuid::Uuid = client
        .query_one(
            "SELECT id FROM txoutbox_messages WHERE status = 'failed' LIMIT 1",
            &[],
        )
        .await?
        .get(0);
    // A cursor 500 rows down (in microseconds since the epoch and seq, as `ListCursor` prints).
    let cursor: (i64, i64) = {
        let row = client
            .query_one(
                "SELECT (extract(epoch FROM created_at) * 1000000)::int8, seq FROM txoutbox_messages \
                 ORDER BY created_at DESC, seq DESC OFFSET 500 LIMIT 1",
                &[],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    Ok((failed, cursor))
}

/// The times of `requests` requests of `url`, after one untimed request: the pool's connections
/// and the plans are warm, as in a dashboard that has been up for a while.
async fn page_times(http: &reqwest::Client, url: &str, requests: usize) -> Result<Vec<Duration>> {
    http.get(url).send().await?.bytes().await?;
    let mut times = Vec::with_capacity(requests);
    for _ in 0..requests {
        let t = Instant::now();
        let res = http.get(url).send().await?;
        let status = res.status();
        res.bytes().await?;
        anyhow::ensure!(status.is_success(), "{url}: {status}");
        times.push(t.elapsed());
    }
    Ok(times)
}
