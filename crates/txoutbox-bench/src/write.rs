//! The write-path benchmark: transactions/s of a business insert alone (the baseline), of the
//! hand-written SQL a team would write without a framework to store the same information, and of
//! the full idempotent path, at several client counts, plus WAL bytes per request.

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
    /// Measure only these modes (for profiling one; the ratios need `business` and the
    /// hand-written ones).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<Mode>,
}

#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum)]
enum Mode {
    /// BEGIN; INSERT business row; COMMIT.
    Business,
    /// What the framework stores, in the plainest statements: BEGIN; INSERT the key ON CONFLICT
    /// DO NOTHING; INSERT business row; one multi-row INSERT of the 2 outbox rows; UPDATE the key
    /// with the response; COMMIT. Into txoutbox's own tables, so the indexes are the same.
    HandWritten,
    /// The same information in one row, as cheaply as hand-written SQL can: BEGIN; the key's
    /// advisory lock, its lookup and the business insert in one round trip; the key row with the
    /// response and the effects (JSON) and the COMMIT in one round trip (BEGIN and COMMIT sent
    /// by hand on the connection, so the COMMIT can be pipelined). The round trips of the
    /// library's cheapest path.
    HandWrittenOneRow,
    /// HandWrittenOneRow with the BEGIN sent in the first round trip too: two round trips, the
    /// cheapest hand-written SQL here (a library that borrows the caller's transaction cannot
    /// do this: tokio-postgres waits for the BEGIN before it hands out a transaction).
    HandWrittenTwoTrips,
    /// BEGIN; claim key; INSERT business row; 2 outbox rows + stored response; COMMIT.
    Full,
    /// Full, plus a NOTIFY inside the transaction (what txoutbox does not do by default).
    FullNotifyInTx,
    /// Full, plus a coalesced hint after commit (RelayWaker).
    FullHintAfterCommit,
    /// Full, with the business insert pipelined with the key claim (one round trip for both;
    /// the insert is rolled back with everything else when the key is not new).
    FullPipelined,
    /// FullPipelined, with `Claim::commit`: the key, the response and the outbox rows stored
    /// and committed in one round trip.
    FullCommit,
    /// One row per request: FullCommit in a scope with deferred effects (the key row carries
    /// the response and the effects; the relay fans them out).
    FullOneRow,
    /// The business row as the key record (`BusinessKey`): BEGIN; the business insert with its
    /// `UNIQUE` key and fingerprint columns, `ON CONFLICT DO NOTHING`; the 2 outbox rows; COMMIT.
    /// No key row and no stored response: a retry is answered from the business row.
    BusinessKey,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Business => "business insert only",
            Mode::HandWritten => "hand-written SQL, same info",
            Mode::Full => "full path (poll wake-up)",
            Mode::FullNotifyInTx => "full path + NOTIFY in tx",
            Mode::FullHintAfterCommit => "full path + hint after commit",
            Mode::FullPipelined => "full path, insert pipelined",
            Mode::FullCommit => "... + Claim::commit",
            Mode::FullOneRow => "... + deferred effects (1 row)",
            Mode::HandWrittenOneRow => "hand-written SQL, one row",
            Mode::HandWrittenTwoTrips => "... BEGIN pipelined too",
            Mode::BusinessKey => "business row as key record",
        }
    }
}

const INSERT_ORDER: &str =
    "INSERT INTO bench_orders (customer, amount) VALUES ($1, $2) RETURNING id";

/// The hand-written baseline's statements (see [`Mode::HandWritten`]).
const HAND_CLAIM_KEY: &str = "INSERT INTO txoutbox_idempotency_keys \
     (scope, key, fingerprint, state, expires_at) \
     VALUES ($1, $2, $3, 'in_flight', now() + interval '24 hours') ON CONFLICT DO NOTHING";
const HAND_OUTBOX: &str = "INSERT INTO txoutbox_messages \
     (id, destination, payload, downstream_key) VALUES ($1, 'stripe', $2, $3), ($4, 'email', $5, $6)";
const HAND_COMPLETE_KEY: &str = "UPDATE txoutbox_idempotency_keys SET state = 'completed', \
     response_status = $3, response_headers = $4, response_body = $5 \
     WHERE scope = $1 AND key = $2";

/// [`Mode::HandWrittenOneRow`]'s statements.
const HAND_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(10) || $2, 4411))";
const HAND_LOOKUP: &str = "SELECT fingerprint, response_status, response_headers, response_body \
     FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2";
const HAND_STORE_ONE_ROW: &str = "INSERT INTO txoutbox_idempotency_keys \
     (scope, key, fingerprint, state, response_status, response_headers, response_body, \
     expires_at, effects) \
     VALUES ($1, $2, $3, 'completed', $4, $5, $6, now() + interval '24 hours', $7)";

/// The modes, in the order they run at each client count (the baselines first).
const MODES: [Mode; 11] = [
    Mode::Business,
    Mode::HandWritten,
    Mode::HandWrittenOneRow,
    Mode::HandWrittenTwoTrips,
    Mode::Full,
    Mode::FullNotifyInTx,
    Mode::FullHintAfterCommit,
    Mode::FullPipelined,
    Mode::FullCommit,
    Mode::FullOneRow,
    Mode::BusinessKey,
];

/// [`Mode::BusinessKey`]'s table and statements: the business table with the key and the
/// fingerprint as its own columns.
const KEYED_ORDERS: &str = "CREATE TABLE bench_keyed_orders (id bigserial PRIMARY KEY, \
     customer text NOT NULL, amount bigint NOT NULL, idempotency_key text NOT NULL UNIQUE, \
     request_fingerprint bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now())";
const KEYED_LOOKUP: &str = "SELECT id FROM bench_keyed_orders WHERE idempotency_key = $1";
const KEYED_INSERT: &str = "INSERT INTO bench_keyed_orders \
     (customer, amount, idempotency_key, request_fingerprint) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (idempotency_key) DO NOTHING RETURNING id";

/// The command that reproduces the rows of `clients` clients (and, for 8, the `ratio:` lines).
fn command(args: &Args, clients: usize) -> String {
    let mut command = format!(
        "$ cargo run --release -p txoutbox-bench -- write --clients {clients} --seconds {}",
        args.seconds
    );
    if clients != 8 {
        command.push_str(&format!(" --ratio-at {clients}"));
    }
    for index in &args.drop_index {
        command.push_str(&format!(" --drop-index {index}"));
    }
    if !args.modes.is_empty() {
        let modes: Vec<String> = args
            .modes
            .iter()
            .filter_map(clap::ValueEnum::to_possible_value)
            .map(|v| v.get_name().to_owned())
            .collect();
        command.push_str(&format!(" --modes {}", modes.join(",")));
    }
    command
}

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
    setup.batch_execute(KEYED_ORDERS).await?;
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
    let mut ratio = Ratios::default();
    println!(
        "{:>7}  {:<30} {:>10} {:>8} {:>8} {:>12}",
        "clients", "mode", "tx/s", "ratio", "vs hand", "WAL B/req"
    );
    for &clients in &args.clients {
        let (mut baseline, mut cheapest, mut same_trips) = (0.0, 0.0f64, 0.0);
        for mode in MODES
            .into_iter()
            .filter(|m| args.modes.is_empty() || args.modes.contains(m))
        {
            // Every mode starts from the same state: empty tables, a fresh checkpoint.
            setup
                .batch_execute(
                    "TRUNCATE bench_orders, bench_keyed_orders, txoutbox_messages, \
                     txoutbox_idempotency_keys; CHECKPOINT",
                )
                .await?;
            let (tps, wal) = measure(&pool, &setup, &waker, mode, clients, args.seconds).await?;
            match mode {
                Mode::Business => baseline = tps,
                // Against the cheapest hand-written SQL (the baselines run first).
                Mode::HandWritten | Mode::HandWrittenOneRow | Mode::HandWrittenTwoTrips => {
                    cheapest = cheapest.max(tps);
                    if mode == Mode::HandWrittenOneRow {
                        same_trips = tps;
                    }
                }
                _ => {}
            }
            let r = tps / baseline;
            let vs_hand = if mode == Mode::Business {
                "".to_string()
            } else {
                format!("{:.2}", tps / cheapest)
            };
            if clients == args.ratio_at {
                match mode {
                    Mode::FullOneRow => ratio.one_row = Some((r, tps / cheapest, tps / same_trips)),
                    Mode::Full => ratio.rows = Some(r),
                    _ => {}
                }
            }
            println!(
                "{clients:>7}  {:<30} {tps:>10.0} {r:>8.2} {vs_hand:>8} {wal:>12.0}",
                mode.name()
            );
        }
        println!("         {}", command(args, clients));
    }
    let reproduce = command(args, args.ratio_at);
    match ratio.one_row {
        Some((business, hand, same_trips)) => {
            println!(
                "ratio: {business:.2} (full path with one row per request: deferred effects, \
                 Claim::commit / business insert only, {} clients)  {reproduce}",
                args.ratio_at
            );
            println!(
                "ratio to hand-written SQL: {hand:.2} (the same / the cheapest hand-written SQL \
                 storing the same information, {} clients)  {reproduce}",
                args.ratio_at
            );
            println!(
                "ratio to hand-written SQL with the same round trips: {same_trips:.2} (the same / \
                 hand-written SQL, one row, {} clients)  {reproduce}",
                args.ratio_at
            );
        }
        None => println!("ratio: n/a (no run at {} clients)", args.ratio_at),
    }
    if let Some(rows) = ratio.rows {
        println!(
            "ratio with the effects as rows at commit: {rows:.2} (full path, begin and complete \
             one after the other / business insert only, {} clients)  {reproduce}",
            args.ratio_at
        );
    }
    Ok(())
}

/// The ratios the run ends with.
#[derive(Default)]
struct Ratios {
    /// [`Mode::FullOneRow`] against the business insert, the cheapest hand-written SQL and the
    /// hand-written SQL with the same round trips.
    one_row: Option<(f64, f64, f64)>,
    /// [`Mode::Full`] against the business insert.
    rows: Option<f64>,
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
            let scope = match mode {
                Mode::FullOneRow => Scope::new("bench")?.with_deferred_effects(),
                _ => Scope::new("bench")?,
            };
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
    if matches!(mode, Mode::HandWrittenOneRow | Mode::HandWrittenTwoTrips) {
        let two_trips = mode == Mode::HandWrittenTwoTrips;
        return hand_written_one_row(client, scope, &customer, amount, two_trips).await;
    }
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
    if mode == Mode::HandWritten {
        return hand_written(tx, scope, &key, &fingerprint, &customer, amount).await;
    }
    if mode == Mode::BusinessKey {
        return business_key(tx, scope, &key, &fingerprint, &customer, amount).await;
    }
    let insert = tx.prepare_cached(INSERT_ORDER).await?;
    let values: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&customer, &amount];
    let pipelined = matches!(
        mode,
        Mode::FullPipelined | Mode::FullCommit | Mode::FullOneRow
    );
    let (outcome, row) = if pipelined {
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
    for (effect, message) in effects(id, amount, &customer)? {
        claim.enqueue(effect, message)?;
    }
    if mode == Mode::FullNotifyInTx {
        txoutbox::relay::notify_in_transaction(&tx).await?;
    }
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!(r#"{{"order":{id}}}"#).into_bytes(),
    };
    if matches!(mode, Mode::FullCommit | Mode::FullOneRow) {
        claim.commit(tx, &response).await?;
        return Ok(());
    }
    claim.complete(&tx, &response).await?;
    tx.commit().await?;
    if mode == Mode::FullHintAfterCommit {
        waker.wake();
    }
    Ok(())
}

/// The two effects of an order request, by effect name: its charge and its receipt.
fn effects(id: i64, amount: i64, customer: &str) -> Result<[(&'static str, OutboxMessage); 2]> {
    Ok([
        (
            "charge",
            OutboxMessage::new(
                "stripe",
                &serde_json::json!({"order": id, "amount": amount}),
            )?,
        ),
        (
            "receipt",
            OutboxMessage::new("email", &serde_json::json!({"order": id, "to": customer}))?,
        ),
    ])
}

/// One request with the business row as its key record ([`Mode::BusinessKey`]).
async fn business_key(
    tx: deadpool_postgres::Transaction<'_>,
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    customer: &str,
    amount: i64,
) -> Result<()> {
    use tokio_postgres::types::Type;
    use txoutbox::idempotency::{BusinessKey, RowBegin};
    let orders = BusinessKey::new(scope.clone(), KEYED_LOOKUP, "request_fingerprint");
    let fp: &[u8] = fingerprint.as_bytes();
    let begun = orders
        .begin(
            &*tx,
            key,
            fingerprint,
            KEYED_INSERT,
            &[
                (&customer, Type::TEXT),
                (&amount, Type::INT8),
                (&key.as_str(), Type::TEXT),
                (&fp, Type::BYTEA),
            ],
        )
        .await?;
    let RowBegin::New { row, mut claim } = begun else {
        anyhow::bail!("a fresh key was not new");
    };
    let id: i64 = row.get(0);
    for (effect, message) in effects(id, amount, customer)? {
        claim.enqueue(effect, message)?;
    }
    claim.complete(&*tx).await?;
    tx.commit().await?;
    Ok(())
}

/// One request as a team would write it by hand storing the same information in one row
/// ([`Mode::HandWrittenOneRow`]): three round trips, the transaction begun and committed by hand
/// so that the COMMIT rides with the key row's insert; with `two_trips`, the BEGIN rides with the
/// first statements too ([`Mode::HandWrittenTwoTrips`]).
async fn hand_written_one_row(
    client: &mut deadpool_postgres::Object,
    scope: &Scope,
    customer: &str,
    amount: i64,
    two_trips: bool,
) -> Result<()> {
    let key = uuid::Uuid::now_v7().to_string();
    let body = format!(r#"{{"customer":"{customer}","amount":{amount}}}"#);
    let fingerprint = Fingerprint::new("POST", "/orders", body.as_bytes());
    let scope = scope.name();
    let (lock, lookup, insert, store) = (
        client.prepare_cached(HAND_LOCK).await?,
        client.prepare_cached(HAND_LOOKUP).await?,
        client.prepare_cached(INSERT_ORDER).await?,
        client.prepare_cached(HAND_STORE_ONE_ROW).await?,
    );
    type Values<'a> = Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)>;
    let key_values: Values = vec![&scope, &key];
    let order_values: Values = vec![&customer, &amount];
    if !two_trips {
        client.batch_execute("BEGIN").await?;
    }
    // With two trips the BEGIN is the first request of the pipeline (polled first by join!).
    let pipelined_begin = async {
        if two_trips {
            client.batch_execute("BEGIN").await
        } else {
            Ok(())
        }
    };
    let (begun, locked, found, order) = futures::join!(
        pipelined_begin,
        client.query(&lock, &key_values),
        client.query(&lookup, &key_values),
        client.query(&insert, &order_values)
    );
    begun?;
    locked?;
    anyhow::ensure!(found?.is_empty(), "a fresh key was not new");
    let id: i64 = order?.first().map(|r| r.get(0)).unwrap_or_default();
    let effects = serde_json::json!([
        {"id": uuid::Uuid::now_v7(), "destination": "stripe",
         "payload": {"order": id, "amount": amount}, "downstream_key": format!("{scope}:{key}:charge")},
        {"id": uuid::Uuid::now_v7(), "destination": "email",
         "payload": {"order": id, "to": customer}, "downstream_key": format!("{scope}:{key}:receipt")},
    ]);
    let (fp, headers, response) = (
        fingerprint.as_bytes().as_slice(),
        serde_json::json!([["content-type", "application/json"]]),
        format!(r#"{{"order":{id}}}"#).into_bytes(),
    );
    let store_values: Values = vec![&scope, &key, &fp, &201i16, &headers, &response, &effects];
    let (stored, committed) = futures::join!(
        client.execute(&store, &store_values),
        client.batch_execute("COMMIT")
    );
    stored?;
    committed?;
    Ok(())
}

/// One request as a team would write it without a framework, storing what the framework stores:
/// the key row (scope, key, fingerprint, state, then the response), the business row and the 2
/// outbox rows, each effect's downstream key derived from the request's key.
async fn hand_written(
    tx: deadpool_postgres::Transaction<'_>,
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    customer: &str,
    amount: i64,
) -> Result<()> {
    let (scope, key) = (scope.name(), key.as_str());
    let claim = tx.prepare_cached(HAND_CLAIM_KEY).await?;
    let claimed = tx
        .execute(&claim, &[&scope, &key, &fingerprint.as_bytes().as_slice()])
        .await?;
    anyhow::ensure!(claimed == 1, "a fresh key was not new");
    let insert = tx.prepare_cached(INSERT_ORDER).await?;
    let id: i64 = tx.query_one(&insert, &[&customer, &amount]).await?.get(0);
    let outbox = tx.prepare_cached(HAND_OUTBOX).await?;
    let (charge, receipt) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    tx.execute(
        &outbox,
        &[
            &charge,
            &serde_json::json!({"order": id, "amount": amount}),
            &format!("{scope}:{key}:charge"),
            &receipt,
            &serde_json::json!({"order": id, "to": customer}),
            &format!("{scope}:{key}:receipt"),
        ],
    )
    .await?;
    let complete = tx.prepare_cached(HAND_COMPLETE_KEY).await?;
    tx.execute(
        &complete,
        &[
            &scope,
            &key,
            &201i16,
            &serde_json::json!([["content-type", "application/json"]]),
            &format!(r#"{{"order":{id}}}"#).into_bytes(),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
