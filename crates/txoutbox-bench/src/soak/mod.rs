//! The fault-injection soak: real `txoutbox relay` processes against a private Postgres and a
//! scripted webhook downstream, with faults drawn from a seed ([`plan`]); at the end, with every
//! relay stopped, the invariants are checked ([`check`]) and a table is printed.
//!
//! The run: start a cluster and migrate a database; copy the attempt log and the delivered
//! history into tables of the soak's own by trigger (so `txoutbox purge` hides nothing from the
//! checker); start the downstream and the relays; over the first 70 % of the chaos window,
//! while the timed events happen, write the rows two ways: the batch-job path
//! (`txoutbox::enqueue` with keys of the soak's own, `batch`, and a few undecodable rows
//! stored with SQL) and the write path as services drive it (requests through `begin` or a
//! `BusinessKey`, [`requests`]); let the backlog settle (bounded); SIGTERM every relay; check.

pub mod check;
pub mod downstream;
pub mod plan;
pub mod relays;
pub mod requests;

mod batch;
mod report;
mod state;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use txoutbox_test_support::{Cluster, ClusterOptions, TestDb};

use check::{Committed, Expect};
use downstream::Downstream;
use plan::{EventKind, Plan, AT_LEAST_ONCE, AT_MOST_ONCE};
use relays::{Fleet, RelaySpec};
use state::{read_final, AUDIT, ROW_OF_PAYLOAD, UNSETTLED};

pub use report::SoakReport;

/// The soak's knobs.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The seed of the fault plan.
    pub seed: u64,
    /// How long faults are injected (rows arrive over its first 70 %).
    pub chaos: Duration,
    /// Rows written (by the batch path and by requests).
    pub rows: usize,
    /// Relay processes.
    pub relays: usize,
    /// The relays' lease (default 15 s: the webhook sink's 10 s timeout must fit, with a margin).
    pub lease: Duration,
    /// The relays' shutdown grace.
    pub grace: Duration,
    /// Attempts before a row is dead-lettered.
    pub max_attempts: u32,
    /// How long the backlog may take to settle once the chaos ends.
    pub settle: Duration,
    /// Store about 1 % of the rows with payloads the relay cannot decode (default on).
    pub hostile: bool,
    /// The `txoutbox` binary.
    pub txoutbox_bin: PathBuf,
    /// Where the relays' logs go (default: a new directory under the system's temp dir).
    pub log_dir: Option<PathBuf>,
}

impl SoakOptions {
    /// Defaults for `seed` and the `txoutbox` binary at `bin`.
    pub fn new(seed: u64, bin: PathBuf) -> Self {
        Self {
            seed,
            chaos: Duration::from_secs(60),
            rows: 1000,
            relays: 3,
            lease: Duration::from_secs(15),
            grace: Duration::from_secs(3),
            max_attempts: 6,
            settle: Duration::from_secs(120),
            hostile: true,
            txoutbox_bin: bin,
            log_dir: None,
        }
    }
}

/// Runs the soak and checks it; violations are in the report, not an error. Errors are for a
/// soak that could not run (no Postgres binaries, a relay that cannot start).
pub async fn run(options: &SoakOptions) -> Result<SoakReport> {
    let began = Instant::now();
    anyhow::ensure!(
        options.txoutbox_bin.is_file(),
        "no txoutbox binary at {} (build it: cargo build -p txoutbox-cli, with --release for a \
         release soak; or pass --txoutbox-bin)",
        options.txoutbox_bin.display()
    );
    let plan = Arc::new(Plan::draw(
        options.seed,
        options.rows,
        options.relays,
        options.chaos,
        options.hostile,
    ));
    println!("soak: seed {} ({plan})", options.seed);
    let log_dir = match &options.log_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!(
            "txoutbox-soak-{}-{}",
            options.seed,
            std::process::id()
        )),
    };
    std::fs::create_dir_all(&log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    println!("soak: relay logs in {}", log_dir.display());
    let (cluster, db) = start_database().await?;

    let epoch = Instant::now();
    let downstream = Downstream::start(epoch, options.lease, &plan.rows).await?;
    let spec = RelaySpec {
        bin: options.txoutbox_bin.clone(),
        database_url: db.url(),
        args: relay_args(options, &downstream),
        log_dir: log_dir.clone(),
        grace: options.grace,
    };
    let mut fleet = Fleet::start(spec, options.relays.max(1))?;
    let info = txoutbox_test_support::ConnInfo::parse(&db.url())?;
    let enqueuer = tokio::spawn(batch::enqueue_all(info.pool(2)?, plan.clone(), epoch));
    let writer = tokio::spawn(requests::write_all(info.pool(4)?, plan.clone(), epoch));
    let mut chaos = Chaos {
        fleet: &mut fleet,
        cluster: &cluster,
        db: &db,
        downstream: &downstream,
        faults: BTreeMap::new(),
        notes: Vec::new(),
    };
    chaos.play(&plan, epoch).await?;
    let (mut faults, mut notes) = (chaos.faults, chaos.notes);
    enqueuer.await??;
    let written = writer.await??;

    let observer = db.connect().await?;
    settle(&mut fleet, &observer, options.settle).await?;
    fleet.stop_all().await;

    let state = read_final(&observer).await?;
    let calls = downstream.calls();
    for (kind, n) in downstream.faults() {
        *faults.entry(kind.to_owned()).or_default() += n;
    }
    if downstream.strays() > 0 {
        notes.push(format!(
            "{} requests named no row of the plan",
            downstream.strays()
        ));
    }
    let mut expect = batch_expect(&plan);
    expect.extend(written.expect(&plan));

    let (mut violations, figures) = check::check(&check::Inputs {
        plan: &plan,
        expect: &expect,
        max_attempts: options.max_attempts,
        grace: options.grace,
        calls: &calls,
        state: &state,
        exits: &fleet.exits,
        killed: &fleet.killed,
    });
    violations.extend(written.anomalies);
    let requests = written.figures;
    drop(observer);
    drop(db);
    drop(cluster);
    Ok(SoakReport {
        seed: options.seed,
        digest: plan.digest(),
        rows: plan.rows.len(),
        faults,
        figures,
        requests,
        violations,
        notes,
        log_dir,
        took: began.elapsed(),
    })
}

/// A private cluster and a migrated database with the soak's audit triggers and business table.
async fn start_database() -> Result<(Arc<Cluster>, TestDb)> {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::private(&ClusterOptions {
            fast: true,
            max_connections: 100,
            ..ClusterOptions::default()
        })
    })
    .await??;
    let cluster = Arc::new(cluster);
    let db = TestDb::create_on(&cluster.admin()).await?;
    let client = db.connect().await?;
    client
        .batch_execute(AUDIT)
        .await
        .context("installing the audit triggers")?;
    client.batch_execute(requests::ORDERS).await?;
    Ok((cluster, db))
}

/// Waits for the backlog to settle (the faults scripted per row go on, the timed ones have
/// ended), at most `limit`.
async fn settle(
    fleet: &mut Fleet,
    observer: &tokio_postgres::Client,
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        fleet.check()?;
        let left: i64 = observer.query_one(UNSETTLED, &[]).await?.get(0);
        if left == 0 || Instant::now() >= deadline {
            if left > 0 {
                println!(
                    "soak: {left} rows (or keys carrying effects) had not settled by the deadline"
                );
                print_flow_state(observer).await?;
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Prints what holds unsettled rows back: each destination's flow-control state and its rows
/// by status.
async fn print_flow_state(observer: &tokio_postgres::Client) -> Result<()> {
    for row in observer
        .query(
            "SELECT destination, breaker, failures, opens, \
                 EXTRACT(EPOCH FROM open_until - now())::float8, open_reason, \
                 EXTRACT(EPOCH FROM throttled_until - now())::float8, paused_at IS NOT NULL \
             FROM txoutbox_destinations ORDER BY destination",
            &[],
        )
        .await?
    {
        let destination: String = row.get(0);
        let breaker: String = row.get(1);
        let (failures, opens): (i32, i32) = (row.get(2), row.get(3));
        let open_for: Option<f64> = row.get(4);
        let reason: Option<String> = row.get(5);
        let throttled_for: Option<f64> = row.get(6);
        let paused: bool = row.get(7);
        println!(
            "soak: {destination}: breaker {breaker} ({failures} failures, {opens} opens, \
             open for {open_for:?} s: {}), throttled for {throttled_for:?} s, paused {paused}",
            reason.unwrap_or_default()
        );
    }
    for row in observer
        .query(
            "SELECT destination, status, attempts > 0, count(*), \
                 EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8 \
             FROM txoutbox_messages GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            &[],
        )
        .await?
    {
        let (destination, status): (String, String) = (row.get(0), row.get(1));
        let (tried, n): (bool, i64) = (row.get(2), row.get(3));
        let overdue: Option<f64> = row.get(4);
        println!(
            "soak: {destination} {status} (attempted: {tried}): {n} rows, the oldest due {overdue:?} s ago"
        );
    }
    Ok(())
}

/// The timed events and what they need.
struct Chaos<'a> {
    fleet: &'a mut Fleet,
    cluster: &'a Arc<Cluster>,
    db: &'a TestDb,
    downstream: &'a Downstream,
    faults: BTreeMap<String, u64>,
    notes: Vec<String>,
}

impl Chaos<'_> {
    /// The timed events, in order; relays that died unasked are noticed and replaced meanwhile.
    async fn play(&mut self, plan: &Plan, epoch: Instant) -> Result<()> {
        for event in &plan.events {
            while epoch.elapsed() < event.at {
                self.fleet.check()?;
                let left = event.at.saturating_sub(epoch.elapsed());
                tokio::time::sleep(left.min(Duration::from_millis(250))).await;
            }
            if self.event(event.kind).await? {
                *self.faults.entry(event.kind.name().to_owned()).or_default() += 1;
            }
        }
        while epoch.elapsed() < plan.chaos {
            self.fleet.check()?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(())
    }

    /// Does one event; false when it could not be done.
    async fn event(&mut self, kind: EventKind) -> Result<bool> {
        match kind {
            EventKind::Sigterm(i) => self.fleet.sigterm(i % self.fleet.len()).await?,
            EventKind::Sigkill(i) => {
                // Killed while keys carry effects, so that the kill may land in a fan-out.
                self.await_effects_on_keys().await;
                self.fleet.sigkill(i % self.fleet.len()).await?
            }
            EventKind::PostgresRestart => {
                let c = self.cluster.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || c.restart()).await? {
                    // Without a server the run cannot go on: try to start it again.
                    self.notes.push(format!("Postgres restart failed: {e:#}"));
                    let c = self.cluster.clone();
                    tokio::task::spawn_blocking(move || c.start()).await??;
                    return Ok(false);
                }
            }
            EventKind::Storm(length) => self.downstream.storm(length),
            EventKind::Replay => {
                replay(self.fleet, self.db, self.downstream, &mut self.notes).await
            }
            EventKind::Purge => {
                let args = ["purge", "--retention", "2s", "--batch", "50"].map(str::to_owned);
                let (ok, out) = self.fleet.admin(&args).await?;
                if !ok {
                    self.notes
                        .push(format!("txoutbox purge failed: {}", out.trim()));
                }
            }
        }
        Ok(true)
    }

    /// Waits (at most 2 s) until some key row carries effects not yet fanned out.
    async fn await_effects_on_keys(&self) {
        let Ok(client) = self.db.connect().await else {
            return;
        };
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let carried = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM txoutbox_idempotency_keys \
                     WHERE effects IS NOT NULL)",
                    &[],
                )
                .await;
            match carried {
                Ok(row) if row.get::<_, bool>(0) => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(_) => return,
            }
        }
    }
}

fn relay_args(options: &SoakOptions, downstream: &Downstream) -> Vec<String> {
    let mut args: Vec<String> = [
        "--webhook",
        &format!("{AT_LEAST_ONCE}={}", downstream.url("alo")),
        "--webhook",
        &format!("{AT_MOST_ONCE}={}", downstream.url("amo")),
        "--webhook-secret",
        "whsec_c29hay1zZWNyZXQ=",
        "--at-most-once",
        AT_MOST_ONCE,
        "--batch-size",
        "20",
        "--concurrency",
        "16",
        "--poll-interval",
        "200ms",
        "--retry-base",
        "100ms",
        "--retry-cap",
        "2s",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend([
        "--lease".to_owned(),
        format!("{}ms", options.lease.as_millis()),
        "--shutdown-grace".to_owned(),
        format!("{}ms", options.grace.as_millis()),
        "--max-attempts".to_owned(),
        options.max_attempts.to_string(),
    ]);
    args
}

/// The operator's replay, beside the relays: failed at-least-once rows by filter (the
/// downstream deduplicates), and unknown at-most-once rows by id, only those whose effect did
/// not happen (what an operator checks before replaying one).
async fn replay(fleet: &Fleet, db: &TestDb, downstream: &Downstream, notes: &mut Vec<String>) {
    let args = [
        "replay",
        "--status",
        "failed",
        "--destination",
        AT_LEAST_ONCE,
        "--yes",
    ]
    .map(str::to_owned);
    match fleet.admin(&args).await {
        Ok((true, _)) => {}
        Ok((false, out)) => notes.push(format!("txoutbox replay (failed) failed: {}", out.trim())),
        Err(e) => notes.push(format!("txoutbox replay (failed) did not run: {e:#}")),
    }
    let unknown = async {
        let client = db.connect().await?;
        let query =
            format!("SELECT id, {ROW_OF_PAYLOAD} FROM txoutbox_messages WHERE status = 'unknown'");
        let rows = client.query(&query, &[]).await?;
        anyhow::Ok(
            rows.iter()
                .filter_map(|r| {
                    let id: uuid::Uuid = r.get(0);
                    let row = usize::try_from(r.get::<_, Option<i64>>(1)?).ok()?;
                    (!downstream.applied(row)).then_some(id.to_string())
                })
                .take(50)
                .collect::<Vec<_>>(),
        )
    }
    .await;
    match unknown {
        Ok(ids) if !ids.is_empty() => {
            let mut args = vec!["replay".to_owned()];
            args.extend(ids);
            args.push("--yes".to_owned());
            match fleet.admin(&args).await {
                Ok((true, _)) => {}
                Ok((false, out)) => {
                    notes.push(format!("txoutbox replay (unknown) failed: {}", out.trim()))
                }
                Err(e) => notes.push(format!("txoutbox replay (unknown) did not run: {e:#}")),
            }
        }
        Ok(_) => {}
        Err(e) => notes.push(format!("listing unknown rows failed: {e:#}")),
    }
}

/// What is known of the rows `txoutbox::enqueue` writes: each is committed (a failed transaction
/// is tried again until it commits), with the soak's own downstream key.
fn batch_expect(plan: &Plan) -> HashMap<usize, Expect> {
    plan.rows
        .iter()
        .map(|row| {
            let expect = Expect {
                committed: Committed::Yes,
                key: Some(plan::downstream_key(row.index)),
                request: None,
            };
            (row.index, expect)
        })
        .collect()
}
