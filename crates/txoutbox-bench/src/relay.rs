//! The relay benchmarks: drain throughput against a raw-SQL drain loop and a single-statement
//! delete drain on the same backlog, the relay's memory while it drains, the relay's drain rate
//! with rows waiting behind failed ordering heads and with delivered history (what either costs
//! the claim); with `--peer`, the relay at its defaults beside a peer's drain.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use txoutbox::{
    relay::{Relay, RelayConfig},
    sink::{Delivery, DeliveryError, Receipt, Sink},
};
use txoutbox_test_support::{ConnInfo, TestDb};

/// Options of `txoutbox-bench relay`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Backlog size of the drains (raw loop, single-statement delete, relay).
    #[arg(long, default_value_t = 100_000)]
    rows: i64,
    /// Rows per claim, for every drain.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// The backlog the relay drains in the claim-cost comparisons.
    #[arg(long, default_value_t = 20_000)]
    claim_backlog: i64,
    /// Pending rows waiting behind failed ordering heads for the claim-cost comparison (0 skips
    /// it), e.g. 1000000.
    #[arg(long, default_value_t = 20_000)]
    behind_dead_heads: i64,
    /// How many failed ordering heads those rows wait behind (each its own ordering key).
    #[arg(long, default_value_t = 1_000)]
    dead_heads: i64,
    /// Write the rows behind the failed heads by hand, all due, as rows enqueued before a row
    /// could be written waiting (or by another program): what the claim's parking costs. By
    /// default they are enqueued through the library, waiting behind their heads.
    #[arg(long)]
    raw_behind: bool,
    /// Rows of delivered history for the claim-cost comparison (0 skips it), e.g. 10000000.
    #[arg(long, default_value_t = 200_000)]
    history: i64,
    /// Run the relay's statements unnamed (as behind PgBouncer) instead of prepared.
    #[arg(long)]
    unprepared: bool,
    /// Also drain the same backlog with a peer on the same server, alternately with the relay
    /// at its defaults (`--rounds` times each); prints both and the ratio.
    #[arg(long, value_enum)]
    pub peer: Option<crate::peer::Peer>,
    /// Rounds of the side-by-side comparison with `--peer` (relay, peer, relay, peer, …).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
}

impl DrainArgs {
    /// The command that reproduces this run.
    fn command(&self) -> String {
        format!(
            "$ cargo run --release -p txoutbox-bench -- relay --rows {} --batch {} \
             --claim-backlog {} --behind-dead-heads {} --dead-heads {} --history {}{}{}",
            self.rows,
            self.batch,
            self.claim_backlog,
            self.behind_dead_heads,
            self.dead_heads,
            self.history,
            if self.raw_behind { " --raw-behind" } else { "" },
            if self.unprepared { " --unprepared" } else { "" }
        )
    }
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
/// A drain with no lease at all: each statement takes a batch and deletes it, the rows leaving
/// with the statement's commit (a crash after it loses them). Information only.
const DELETE_DRAIN: &str = "DELETE FROM txoutbox_messages WHERE id IN ( \
     SELECT id FROM txoutbox_messages WHERE status = 'pending' AND next_attempt_at <= now() \
     ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
     RETURNING id, destination, payload, headers, downstream_key";

/// `n` failed ordering heads and `behind` pending rows queued behind them (same ordering keys,
/// later `seq`), enqueued as a service enqueues them ([`txoutbox::enqueue`], 5 000 a
/// transaction): written waiting, never due. With `raw`, the rows behind are written by hand
/// instead, all due, and due before any backlog row filled after them (rows written before
/// waiting rows existed, or by another program): the claim meets them first and parks them.
async fn fill_behind_dead_heads(db: &TestDb, heads: i64, behind: i64, raw: bool) -> Result<()> {
    let mut client = db.connect().await?;
    client.batch_execute(UUID_V7).await?;
    client
        .execute(
            "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key, status, attempts, last_error, next_attempt_at) \
             SELECT bench_uuid_v7(), 'noop', '{\"n\": 1}', 'head-' || g, 'ok-' || g, 'failed', \
                 6, 'dead-lettered', now() - interval '1 hour' \
             FROM generate_series(1, $1::bigint) g",
            &[&heads],
        )
        .await?;
    if raw {
        client
            .execute(
                "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                     ordering_key, next_attempt_at) \
                 SELECT bench_uuid_v7(), 'noop', '{\"n\": 1}', 'behind-' || g, \
                     'ok-' || (1 + g % $1::bigint), now() - interval '1 minute' \
                 FROM generate_series(1, $2::bigint) g",
                &[&heads, &behind],
            )
            .await?;
        return Ok(());
    }
    let payload = serde_json::json!({ "n": 1 });
    let mut g = 1;
    while g <= behind {
        let end = (g + 5_000).min(behind + 1);
        let messages = (g..end)
            .map(|g| {
                Ok(txoutbox::OutboxMessage::new("noop", &payload)?
                    .with_downstream_key(format!("behind-{g}"))
                    .with_ordering_key(format!("ok-{}", 1 + g % heads)))
            })
            .collect::<Result<Vec<_>>>()?;
        let tx = client.transaction().await?;
        txoutbox::enqueue(&tx, &messages).await?;
        tx.commit().await?;
        g = end;
    }
    Ok(())
}

/// `rows` delivered rows in the history table, a day old.
async fn fill_history(client: &tokio_postgres::Client, rows: i64) -> Result<()> {
    let insert = "INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, \
                  downstream_key, attempts, created_at, delivered_at) \
                  SELECT bench_uuid_v7(), g, 'noop', '{\"n\": 1}', '{}', 'h-' || g, 1, \
                  now() - interval '1 day', now() - interval '1 day' \
                  FROM generate_series(1, $1::bigint) g";
    insert_then_analyze(client, insert, "txoutbox_delivered", rows).await
}

/// Runs `insert` (rows 1 to `rows` of `generate_series` as `g`), then VACUUM ANALYZE `table`
/// so the planner sees the rows it wrote.
async fn insert_then_analyze(
    client: &tokio_postgres::Client,
    insert: &str,
    table: &str,
    rows: i64,
) -> Result<()> {
    client.batch_execute(UUID_V7).await?;
    client.execute(insert, &[&rows]).await?;
    client
        .batch_execute(&format!("VACUUM ANALYZE {table}"))
        .await?;
    Ok(())
}

/// Empties every txoutbox table the drains touch and checkpoints, so each run starts alike.
async fn reset(client: &tokio_postgres::Client) -> Result<()> {
    client
        .batch_execute(
            "TRUNCATE txoutbox_messages, txoutbox_delivered, txoutbox_attempt_log; CHECKPOINT",
        )
        .await?;
    Ok(())
}

/// `bench_uuid_v7()`: a UUIDv7 (the time in milliseconds, then random bits), the kind of id the
/// library gives each row it enqueues (`Uuid::now_v7`). Rows filled by hand get the same kind, so
/// the primary keys grow at one end as they do in a service, not at random places.
const UUID_V7: &str = "CREATE OR REPLACE FUNCTION bench_uuid_v7() RETURNS uuid LANGUAGE sql \
    VOLATILE AS $$ SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) \
    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) \
    FROM 3) FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid $$";

/// The process's peak and current resident set (`VmHWM`, `VmRSS`), in KiB.
fn memory() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

async fn fill(client: &tokio_postgres::Client, rows: i64) -> Result<()> {
    let insert = "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key) \
                  SELECT bench_uuid_v7(), 'noop', '{\"n\": 1}', 'k-' || g \
                  FROM generate_series(1, $1::bigint) g";
    insert_then_analyze(client, insert, "txoutbox_messages", rows).await
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

/// Drains the backlog with one `DELETE … SKIP LOCKED … RETURNING` a batch; returns rows/s.
async fn delete_drain(client: &tokio_postgres::Client, batch: usize, rows: i64) -> Result<f64> {
    let drain = client.prepare(DELETE_DRAIN).await?;
    let limit = batch as i64;
    let start = Instant::now();
    let mut drained = 0i64;
    loop {
        let n = client.query(&drain, &[&limit]).await?.len();
        if n == 0 {
            break;
        }
        drained += n as i64;
    }
    anyhow::ensure!(drained == rows, "delete drain saw {drained} of {rows} rows");
    Ok(rows as f64 / start.elapsed().as_secs_f64())
}

/// Drains the backlog with the relay and a no-op sink; returns rows/s.
async fn relay_drain(db: &TestDb, batch: usize, rows: i64, prepared: bool) -> Result<f64> {
    let config = RelayConfig::default()
        .with_batch_size(batch)
        .with_concurrency(batch * 4)
        .with_poll_interval(Duration::from_millis(50))
        .with_prepared_statements(prepared);
    drain_with(db, config, rows).await
}

/// Fills a backlog of `rows` and drains it with the relay at its defaults; returns rows/s.
pub(crate) async fn default_relay_drain(db: &TestDb, rows: i64) -> Result<f64> {
    let client = db.connect().await?;
    reset(&client).await?;
    fill(&client, rows).await?;
    drain_with(db, RelayConfig::default(), rows).await
}

/// Drains the backlog with a relay configured so and a no-op sink; returns rows/s.
async fn drain_with(db: &TestDb, config: RelayConfig, rows: i64) -> Result<f64> {
    let sink = NoopSink::default();
    let relay = Relay::builder(db.config()?)
        .config(config)
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
    // Every call is made; wait for the last completions to commit (rows waiting behind failed
    // heads stay pending: they are not counted).
    loop {
        let left: i64 = observer
            .query_one(
                "SELECT count(*) FROM txoutbox_messages WHERE status = 'in_flight'",
                &[],
            )
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

pub async fn run_drain(db: &TestDb, admin: &ConnInfo, args: &DrainArgs) -> Result<()> {
    let client = db.connect().await?;
    let command = args.command();
    let prepared = !args.unprepared;
    println!(
        "txoutbox-bench relay: backlog {} rows, batch {}, 1 connection per drain, same database, \
         same run",
        args.rows, args.batch
    );
    fill(&client, args.rows).await?;
    let raw = raw_drain(&client, args.batch, args.rows).await?;
    println!("(a) raw SQL drain (claim SKIP LOCKED + delete):              {raw:>9.0} rows/s");
    println!("    {command}");
    reset(&client).await?;
    fill(&client, args.rows).await?;
    let delete = delete_drain(&client, args.batch, args.rows).await?;
    println!(
        "(i) single-statement DELETE … FOR UPDATE SKIP LOCKED … RETURNING drain \
         (no lease; information only): {delete:>9.0} rows/s, {:.2}x (a)",
        delete / raw
    );
    println!("    {command}");
    reset(&client).await?;
    fill(&client, args.rows).await?;
    // The peak resident set of the drain alone: clear the high-water mark first (Linux resets
    // VmHWM to VmRSS on writing 5 to clear_refs).
    let reset_peak = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = memory();
    let relay = relay_drain(db, args.batch, args.rows, prepared).await?;
    let after = memory();
    println!(
        "(b) relay, no-op sink (claim, deliver, fenced completion):   {relay:>9.0} rows/s, \
         {:.2}x (a), {:.2}x (i)",
        relay / raw,
        relay / delete
    );
    println!("    {command}");
    match (before, after) {
        (Some((_, rss_before)), Some((peak, rss_after))) => println!(
            "relay memory draining {} rows: RSS {} MiB before, {} MiB after, peak {} MiB \
             (VmHWM{})",
            args.rows,
            rss_before / 1024,
            rss_after / 1024,
            peak / 1024,
            if reset_peak {
                ", reset before the drain"
            } else {
                " since the process started: clear_refs was not writable"
            }
        ),
        _ => println!("relay memory: n/a (no /proc/self/status)"),
    }
    println!("    {command}");
    if args.behind_dead_heads > 0 || args.history > 0 {
        claim_costs(db, &client, args, prepared, &command).await?;
    }
    println!("ratio: {:.2} (b)/(a)  {command}", relay / raw);
    if let Some(peer) = args.peer {
        crate::peer::compare_drain(peer, db, admin, args.rows, args.rounds).await?;
    }
    Ok(())
}

/// What a claim costs beside a bare backlog: with rows behind failed ordering heads (first
/// drain, then parked) and with delivered history, each drained by the relay in turn.
async fn claim_costs(
    db: &TestDb,
    client: &tokio_postgres::Client,
    args: &DrainArgs,
    prepared: bool,
    command: &str,
) -> Result<()> {
    let backlog = args.claim_backlog;
    reset(client).await?;
    fill(client, backlog).await?;
    let bare = relay_drain(db, args.batch, backlog, prepared).await?;
    println!(
        "claim cost: relay drain of a bare {backlog}-row backlog:            {bare:>9.0} rows/s"
    );
    println!("    {command}");
    if args.behind_dead_heads > 0 {
        reset(client).await?;
        fill_behind_dead_heads(db, args.dead_heads, args.behind_dead_heads, args.raw_behind)
            .await?;
        fill(client, backlog).await?;
        let behind = relay_drain(db, args.batch, backlog, prepared).await?;
        println!(
            "claim cost: same backlog, {} rows pending behind {} failed ordering heads \
             (first drain): {behind:>9.0} rows/s, {:.2}x bare",
            args.behind_dead_heads,
            args.dead_heads,
            behind / bare
        );
        println!("    {command}");
        // The steady state: the rows behind the dead heads stay in the table (waiting, or parked
        // by the first drain when written by hand).
        fill(client, backlog).await?;
        let parked = relay_drain(db, args.batch, backlog, prepared).await?;
        println!(
            "claim cost: same backlog again, the {} rows behind failed heads still there: \
             {parked:>9.0} rows/s, {:.2}x bare",
            args.behind_dead_heads,
            parked / bare
        );
        println!("    {command}");
        // The same three drains as the time each took: rows of other keys held up by the rows
        // waiting behind failed heads, on their first meeting and after.
        let secs = |rate: f64| backlog as f64 / rate;
        println!(
            "dead heads: {backlog} rows of other keys drained in {:.2} s alone, {:.2} s with {} \
             rows waiting behind {} failed heads ({:.2}x alone; first drain), \
             {:.2} s again ({:.2}x alone)",
            secs(bare),
            secs(behind),
            args.behind_dead_heads,
            args.dead_heads,
            secs(behind) / secs(bare),
            secs(parked),
            secs(parked) / secs(bare)
        );
        println!("    {command}");
    }
    if args.history > 0 {
        reset(client).await?;
        fill_history(client, args.history).await?;
        fill(client, backlog).await?;
        let history = relay_drain(db, args.batch, backlog, prepared).await?;
        println!(
            "claim cost: same backlog, {} delivered rows in the history:            \
             {history:>9.0} rows/s, {:.2}x bare",
            args.history,
            history / bare
        );
        println!("    {command}");
    }
    Ok(())
}
