//! The write-path benchmark: transactions/s of a business insert alone (the baseline), of the
//! hand-written SQL a team would write without a framework to store the same information, and of
//! the full idempotent path, at several client counts, plus WAL bytes per request.
//!
//! Layout: this file runs the modes and prints the table; `ratios` the `ratio:` lines;
//! `requests` sends one request of each mode.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use txoutbox::{relay::RelayWaker, Scope};
use txoutbox_test_support::TestDb;

use crate::ratio::Ratio;

mod ratios;
mod requests;
mod sqlx_requests;

use ratios::{median_round, print_ratios, Ratios};

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
    /// Rounds at each client count: every mode asked for, in order, this many times, so that the
    /// modes alternate and a neighbour's load falls on each of them alike. Each round prints its
    /// rows; the `ratio:` lines are the median round's.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
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
    /// FullOneRow with the business insert sent after `begin` answers, as the examples and the
    /// axum extractor write a handler: a round trip more than FullOneRow, which sends the insert
    /// before it knows the key is new.
    FullOneRowAfterBegin,
    /// The business row as the key record (`BusinessKey`): BEGIN; the business insert with its
    /// `UNIQUE` key and fingerprint columns, `ON CONFLICT DO NOTHING`; the 2 outbox rows; COMMIT.
    /// No key row and no stored response: a retry is answered from the business row.
    BusinessKey,
    /// [`Mode::Business`] on sqlx: the sqlx modes' baseline.
    SqlxBusiness,
    /// [`Mode::Full`] on sqlx (`&mut sqlx::Transaction`).
    SqlxFull,
    /// [`Mode::FullCommit`] on sqlx: the statement, then COMMIT (sqlx cannot pipeline them).
    SqlxFullCommit,
    /// [`Mode::FullOneRow`] on sqlx.
    SqlxFullOneRow,
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
            Mode::FullOneRowAfterBegin => "... insert after begin (1 row)",
            Mode::HandWrittenOneRow => "hand-written SQL, one row",
            Mode::HandWrittenTwoTrips => "... BEGIN pipelined too",
            Mode::BusinessKey => "business row as key record",
            Mode::SqlxBusiness => "sqlx: business insert only",
            Mode::SqlxFull => "sqlx: full path (poll wake-up)",
            Mode::SqlxFullCommit => "sqlx: ... + Claim::commit",
            Mode::SqlxFullOneRow => "sqlx: ... + deferred effects",
        }
    }

    fn is_sqlx(self) -> bool {
        matches!(
            self,
            Mode::SqlxBusiness | Mode::SqlxFull | Mode::SqlxFullCommit | Mode::SqlxFullOneRow
        )
    }

    /// The tokio-postgres mode a sqlx mode does the work of.
    fn on_tokio_postgres(self) -> Option<Mode> {
        match self {
            Mode::SqlxBusiness => Some(Mode::Business),
            Mode::SqlxFull => Some(Mode::Full),
            Mode::SqlxFullCommit => Some(Mode::FullCommit),
            Mode::SqlxFullOneRow => Some(Mode::FullOneRow),
            _ => None,
        }
    }
}

/// The modes, in the order they run at each client count (the baselines first).
const MODES: [Mode; 16] = [
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
    Mode::FullOneRowAfterBegin,
    Mode::BusinessKey,
    Mode::SqlxBusiness,
    Mode::SqlxFull,
    Mode::SqlxFullCommit,
    Mode::SqlxFullOneRow,
];

/// [`Mode::BusinessKey`]'s table and statements: the business table with the key and the
/// fingerprint as its own columns.
const KEYED_ORDERS: &str = "CREATE TABLE bench_keyed_orders (id bigserial PRIMARY KEY, \
     customer text NOT NULL, amount bigint NOT NULL, idempotency_key text NOT NULL UNIQUE, \
     request_fingerprint bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now())";
/// The command that reproduces the rows of `clients` clients (and, for 8, the `ratio:` lines).
fn command(args: &Args, clients: usize) -> String {
    let mut command = format!(
        "$ cargo run --release -p txoutbox-bench -- write --clients {clients} --seconds {}",
        args.seconds
    );
    if clients != 8 {
        command.push_str(&format!(" --ratio-at {clients}"));
    }
    if args.rounds != 1 {
        command.push_str(&format!(" --rounds {}", args.rounds));
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
    let sqlx = sqlx_pool(db, max_clients + 1);
    println!(
        "pool: sqlx, max_connections {} (the sqlx modes; prepared statements cached per \
         connection, no pipelining)",
        max_clients + 1
    );
    let waker = RelayWaker::spawn(pool.clone());
    let pools = Pools {
        deadpool: pool,
        sqlx,
        waker,
    };
    println!(
        "{:>7}  {:<30} {:>10} {:>8} {:>8} {:>12} {:>6}",
        "clients", "mode", "tx/s", "ratio", "vs hand", "WAL B/req", "load"
    );
    let mut ratios = Ratios::default();
    for &clients in &args.clients {
        let mut rounds = Vec::new();
        for round in 1..=args.rounds {
            if args.rounds > 1 {
                println!("         round {round} of {}", args.rounds);
            }
            rounds.push(measure_clients(args, &pools, &setup, clients).await?);
        }
        let row = median_round(args, clients, rounds);
        if clients == args.ratio_at {
            ratios = row;
        }
        println!("         {}", command(args, clients));
    }
    print_ratios(args, &ratios);
    Ok(())
}

/// The baselines of one client count, as far as they have run (the baselines run first).
#[derive(Default)]
struct Baselines {
    /// [`Mode::Business`].
    business: Option<f64>,
    /// The cheapest hand-written SQL storing the same information.
    cheapest: Option<f64>,
    /// [`Mode::HandWrittenOneRow`]: the library's cheapest round trips, by hand.
    same_trips: Option<f64>,
    /// [`Mode::SqlxBusiness`]: the sqlx modes' baseline.
    sqlx_business: Option<f64>,
}

/// The connections the modes run on.
struct Pools {
    deadpool: deadpool_postgres::Pool,
    sqlx: sqlx::PgPool,
    waker: RelayWaker,
}

/// A sqlx pool over `db` (its connections opened as the clients ask).
fn sqlx_pool(db: &TestDb, size: usize) -> sqlx::PgPool {
    let info = db.info();
    let mut options = sqlx::postgres::PgConnectOptions::new()
        .host(info.host())
        .port(info.port())
        .username(info.user())
        .database(info.dbname());
    if let Some(password) = info.password() {
        options = options.password(password);
    }
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(size).unwrap_or(u32::MAX))
        .connect_lazy_with(options)
}

/// Measures every mode asked for at `clients` clients, printing a row each; the ratios of the
/// full paths.
async fn measure_clients(
    args: &Args,
    pools: &Pools,
    setup: &tokio_postgres::Client,
    clients: usize,
) -> Result<Ratios> {
    let mut base = Baselines::default();
    let mut ratios = Ratios::default();
    let mut measured = std::collections::HashMap::new();
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
        let (tps, wal) = measure(pools, setup, mode, clients, args.seconds).await?;
        measured.insert(mode, tps);
        if let Some(on_tokio) = mode.on_tokio_postgres() {
            let of_tokio = Ratio::of(tps, measured.get(&on_tokio).copied());
            ratios.sqlx.push((mode, of_tokio));
        }
        match mode {
            Mode::Business => base.business = Some(tps),
            Mode::SqlxBusiness => base.sqlx_business = Some(tps),
            Mode::HandWritten | Mode::HandWrittenOneRow | Mode::HandWrittenTwoTrips => {
                base.cheapest = Some(base.cheapest.map_or(tps, |c| c.max(tps)));
                if mode == Mode::HandWrittenOneRow {
                    base.same_trips = Some(tps);
                }
            }
            _ => {}
        }
        // A sqlx mode against the sqlx baseline: what the write path costs on its driver.
        let r = match mode {
            Mode::SqlxFull | Mode::SqlxFullCommit | Mode::SqlxFullOneRow => {
                Ratio::of(tps, base.sqlx_business)
            }
            _ => Ratio::of(tps, base.business),
        };
        let vs_hand = if mode == Mode::Business {
            String::new()
        } else {
            Ratio::of(tps, base.cheapest).to_string()
        };
        match mode {
            Mode::FullOneRow => {
                ratios.one_row = Some((
                    r,
                    Ratio::of(tps, base.cheapest),
                    Ratio::of(tps, base.same_trips),
                ))
            }
            Mode::Full => ratios.rows = Some(r),
            Mode::FullOneRowAfterBegin => ratios.after_begin = Some(r),
            _ => {}
        }
        let load = crate::peer::load();
        println!(
            "{clients:>7}  {:<30} {tps:>10.0} {r:>8} {vs_hand:>8} {wal:>12.0} {:>6}",
            mode.name(),
            load.split_whitespace().next().unwrap_or("")
        );
    }
    ratios.load = crate::peer::load();
    Ok(ratios)
}

/// A client's connection: deadpool's, or sqlx's for the sqlx modes.
enum Client {
    Deadpool(deadpool_postgres::Object),
    Sqlx(sqlx::pool::PoolConnection<sqlx::Postgres>),
}

async fn measure(
    pools: &Pools,
    observer: &tokio_postgres::Client,
    mode: Mode,
    clients: usize,
    seconds: u64,
) -> Result<(f64, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client_no in 0..clients {
        let (pool, sqlx, stop, done, counting, waker) = (
            pools.deadpool.clone(),
            pools.sqlx.clone(),
            stop.clone(),
            done.clone(),
            counting.clone(),
            pools.waker.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut client = if mode.is_sqlx() {
                Client::Sqlx(sqlx.acquire().await?)
            } else {
                Client::Deadpool(pool.get().await?)
            };
            let scope = match mode {
                Mode::FullOneRow | Mode::FullOneRowAfterBegin | Mode::SqlxFullOneRow => {
                    Scope::new("bench")?.with_deferred_effects()
                }
                _ => Scope::new("bench")?,
            };
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let order = requests::order(client_no, n);
                match &mut client {
                    Client::Deadpool(client) => {
                        requests::one_request(client, &scope, &waker, mode, order).await?
                    }
                    Client::Sqlx(conn) => {
                        sqlx_requests::one_request(conn, &scope, mode, order).await?
                    }
                }
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
