//! The write-path benchmark: transactions/s of a business insert alone (the baseline) and of the
//! full idempotent path, at several client counts, plus WAL bytes per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use txoutbox::{
    relay::RelayWaker, Begin, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse,
};
use txoutbox_test_support::TestDb;

/// Options of `txoutbox-bench write`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Client counts to measure (each client is one connection in a loop).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 8, 32])]
    clients: Vec<usize>,
    /// Seconds each mode runs at each client count.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// The client count the final `ratio:` line reports.
    #[arg(long, default_value_t = 8)]
    ratio_at: usize,
    /// Drop this index of the schema first (repeatable): what an index costs the write path,
    /// e.g. `--drop-index txoutbox_messages_created`.
    #[arg(long = "drop-index", value_name = "INDEX")]
    drop_index: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// BEGIN; INSERT business row; COMMIT.
    Business,
    /// BEGIN; claim key; INSERT business row; 2 outbox rows + stored response; COMMIT.
    Full,
    /// Full, plus a NOTIFY inside the transaction (what txoutbox does not do by default).
    FullNotifyInTx,
    /// Full, plus a coalesced hint after commit (RelayWaker).
    FullHintAfterCommit,
    /// Full, with the business insert pipelined with the key claim (one round trip for both;
    /// the insert is rolled back with everything else when the key is not new).
    FullPipelined,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Business => "business insert only",
            Mode::Full => "full path (poll wake-up)",
            Mode::FullNotifyInTx => "full path + NOTIFY in tx",
            Mode::FullHintAfterCommit => "full path + hint after commit",
            Mode::FullPipelined => "full path, insert pipelined",
        }
    }
}

const INSERT_ORDER: &str =
    "INSERT INTO bench_orders (customer, amount) VALUES ($1, $2) RETURNING id";

pub async fn run(db: &TestDb, args: &Args) -> Result<()> {
    let setup = db.connect().await?;
    for index in &args.drop_index {
        setup
            .batch_execute(&format!("DROP INDEX \"{}\"", index.replace('"', "")))
            .await?;
        println!("dropped index {index}");
    }
    setup
        .batch_execute(
            "CREATE TABLE bench_orders (id bigserial PRIMARY KEY, customer text NOT NULL, \
             amount bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
    let settings = setup
        .query_one(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'), \
             current_setting('shared_buffers'), version()",
            &[],
        )
        .await?;
    println!(
        "txoutbox-bench write: {}s per mode, same database, same run",
        args.seconds
    );
    println!(
        "server: {} | fsync={} synchronous_commit={} shared_buffers={}",
        settings
            .get::<_, String>(3)
            .split(" on ")
            .next()
            .unwrap_or(""),
        settings.get::<_, String>(0),
        settings.get::<_, String>(1),
        settings.get::<_, String>(2)
    );
    let max_clients = args.clients.iter().copied().max().unwrap_or(8);
    let pool = db.pool(max_clients + 1)?;
    println!(
        "pool: deadpool-postgres, max_size {} (one connection per client), prepared statements \
         cached per connection (deadpool's statement cache)",
        max_clients + 1
    );
    let waker = RelayWaker::spawn(pool.clone());
    let mut ratio = None;
    println!(
        "{:>7}  {:<30} {:>10} {:>8} {:>12}",
        "clients", "mode", "tx/s", "ratio", "WAL B/req"
    );
    for &clients in &args.clients {
        let mut baseline = 0.0;
        for mode in [
            Mode::Business,
            Mode::Full,
            Mode::FullNotifyInTx,
            Mode::FullHintAfterCommit,
            Mode::FullPipelined,
        ] {
            // Every mode starts from the same state: empty tables, a fresh checkpoint.
            setup
                .batch_execute(
                    "TRUNCATE bench_orders, txoutbox_messages, txoutbox_idempotency_keys; \
                     CHECKPOINT",
                )
                .await?;
            let (tps, wal) = measure(&pool, &setup, &waker, mode, clients, args.seconds).await?;
            if mode == Mode::Business {
                baseline = tps;
            }
            let r = tps / baseline;
            if mode == Mode::Full && clients == args.ratio_at {
                ratio = Some(r);
            }
            println!(
                "{clients:>7}  {:<30} {tps:>10.0} {r:>8.2} {wal:>12.0}",
                mode.name()
            );
        }
    }
    match ratio {
        Some(r) => println!("ratio: {r:.2}"),
        None => println!("ratio: n/a (no run at {} clients)", args.ratio_at),
    }
    Ok(())
}

async fn measure(
    pool: &deadpool_postgres::Pool,
    observer: &tokio_postgres::Client,
    waker: &RelayWaker,
    mode: Mode,
    clients: usize,
    seconds: u64,
) -> Result<(f64, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client_no in 0..clients {
        let (pool, stop, done, counting, waker) = (
            pool.clone(),
            stop.clone(),
            done.clone(),
            counting.clone(),
            waker.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut client = pool.get().await?;
            let scope = Scope::new("bench")?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                one_request(&mut client, &scope, &waker, mode, client_no, n).await?;
                if counting.load(Ordering::Relaxed) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    // One second of warm-up, then the measured window.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lsn_before: String = observer
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let count = done.load(Ordering::Relaxed);
    let wal: f64 = observer
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
            &[&lsn_before],
        )
        .await?
        .get(0);
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    Ok((count as f64 / elapsed, wal / count.max(1) as f64))
}

async fn one_request(
    client: &mut deadpool_postgres::Object,
    scope: &Scope,
    waker: &RelayWaker,
    mode: Mode,
    client_no: usize,
    n: u64,
) -> Result<()> {
    let customer = format!("customer-{client_no}");
    let amount = (n % 10_000) as i64;
    let tx = client.transaction().await?;
    if mode == Mode::Business {
        let insert = tx.prepare_cached(INSERT_ORDER).await?;
        tx.query(&insert, &[&customer, &amount]).await?;
        tx.commit().await?;
        return Ok(());
    }
    let key = IdempotencyKey::parse(&uuid::Uuid::now_v7().to_string())?;
    let body = format!(r#"{{"customer":"{customer}","amount":{amount}}}"#);
    let fingerprint = Fingerprint::new("POST", "/orders", body.as_bytes());
    let insert = tx.prepare_cached(INSERT_ORDER).await?;
    let values: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&customer, &amount];
    let (outcome, row) = if mode == Mode::FullPipelined {
        let (outcome, row) = futures::join!(
            txoutbox::begin(&tx, scope, &key, &fingerprint),
            tx.query(&insert, &values)
        );
        (outcome?, row)
    } else {
        let outcome = txoutbox::begin(&tx, scope, &key, &fingerprint).await?;
        (outcome, tx.query(&insert, &values).await)
    };
    let Begin::New(mut claim) = outcome else {
        anyhow::bail!("a fresh key was not new");
    };
    let row = row?;
    let id: i64 = row.first().map(|r| r.get(0)).unwrap_or_default();
    claim.enqueue(
        "charge",
        OutboxMessage::new(
            "stripe",
            &serde_json::json!({"order": id, "amount": amount}),
        )?,
    )?;
    claim.enqueue(
        "receipt",
        OutboxMessage::new("email", &serde_json::json!({"order": id, "to": customer}))?,
    )?;
    if mode == Mode::FullNotifyInTx {
        txoutbox::relay::notify_in_transaction(&tx).await?;
    }
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!(r#"{{"order":{id}}}"#).into_bytes(),
    };
    claim.complete(&tx, &response).await?;
    tx.commit().await?;
    if mode == Mode::FullHintAfterCommit {
        waker.wake();
    }
    Ok(())
}
