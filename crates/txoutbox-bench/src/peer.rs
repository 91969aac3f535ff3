//! A peer measured beside txoutbox in the same run, on the same server: graphile-worker 0.18
//! (Node.js, a job queue on Postgres), in its high-throughput setting (a local queue of 500 jobs,
//! batched completions, concurrency 24). Its scripts are this crate's (`src/peer/*.js`), written
//! to a scratch directory where npm installs graphile-worker 0.18.0 and pg 8 on first use. Without
//! `node` and `npm` on the PATH the peer is skipped, and the bench says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use txoutbox_test_support::{ConnInfo, TestDb};

/// The peers the bench knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// graphile-worker 0.18.0 (Node.js): local queue 500, batched completions, concurrency 24.
    GraphileWorker,
}

const PACKAGE_JSON: &str = include_str!("peer/package.json");
const DRAIN_JS: &str = include_str!("peer/graphile-worker-drain.js");
const LATENCY_JS: &str = include_str!("peer/graphile-worker-latency.js");

/// The scratch directory the peer is installed in (`TXOUTBOX_BENCH_PEERS` or the temp dir's
/// `txoutbox-bench-peers`).
fn scratch() -> PathBuf {
    std::env::var_os("TXOUTBOX_BENCH_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("txoutbox-bench-peers"))
}

/// graphile-worker, installed and ready to run against a database of its own.
pub struct GraphileWorker {
    dir: PathBuf,
    db: TestDb,
}

/// A program's version, or why it cannot run.
fn version(program: &str) -> Result<String> {
    let out = Command::new(program)
        .arg("--version")
        .output()
        .with_context(|| format!("`{program}` is not on the PATH"))?;
    if !out.status.success() {
        bail!("`{program} --version` failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Writes the package manifest and the scripts, and runs `npm install` unless graphile-worker
/// 0.18.0 is already there.
fn install(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("package.json"), PACKAGE_JSON)?;
    std::fs::write(dir.join("graphile-worker-drain.js"), DRAIN_JS)?;
    std::fs::write(dir.join("graphile-worker-latency.js"), LATENCY_JS)?;
    let installed = std::fs::read_to_string(dir.join("node_modules/graphile-worker/package.json"))
        .is_ok_and(|p| p.contains("\"version\": \"0.18.0\""));
    if installed {
        return Ok(());
    }
    println!(
        "peer: installing graphile-worker 0.18.0 and pg 8 with npm into {}",
        dir.display()
    );
    let status = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent"])
        .current_dir(dir)
        .status()
        .context("running npm install")?;
    if !status.success() {
        bail!("npm install failed in {}", dir.display());
    }
    Ok(())
}

impl GraphileWorker {
    /// Installs the peer (once) and gives it a database of its own on `admin`'s server. `None`,
    /// with the reason printed, when `node` or `npm` is missing.
    pub async fn prepare(admin: &ConnInfo) -> Result<Option<Self>> {
        let (node, npm) = match (version("node"), version("npm")) {
            (Ok(node), Ok(npm)) => (node, npm),
            (Err(e), _) | (_, Err(e)) => {
                println!("peer graphile-worker skipped: {e} (it needs node and npm)");
                return Ok(None);
            }
        };
        let dir = scratch();
        install(&dir)?;
        println!(
            "peer: graphile-worker 0.18.0 on node {node} (npm {npm}), in {}",
            dir.display()
        );
        let db = TestDb::create_on(admin).await?;
        Ok(Some(Self { dir, db }))
    }

    /// Runs one of the scripts with `env`, on the peer's database; returns its JSON line.
    fn script(&self, name: &str, env: &[(&str, String)]) -> Result<serde_json::Value> {
        let info = self.db.info();
        let mut command = Command::new("node");
        command
            .arg(name)
            .current_dir(&self.dir)
            .env_remove("DATABASE_URL")
            .env("PGHOST", info.host())
            .env("PGPORT", info.port().to_string())
            .env("PGUSER", info.user())
            .env("PGDATABASE", info.dbname());
        if let Some(password) = info.password() {
            command.env("PGPASSWORD", password);
        }
        for (key, value) in env {
            command.env(key, value);
        }
        let out = command
            .output()
            .with_context(|| format!("running node {name}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "node {name} failed: {}{}",
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .with_context(|| format!("node {name} printed no result: {stdout}"))?;
        Ok(serde_json::from_str(line)?)
    }

    /// Drains `rows` no-op jobs; returns rows/s.
    pub fn drain(&self, rows: i64) -> Result<f64> {
        let out = self.script("graphile-worker-drain.js", &[("N", rows.to_string())])?;
        out["rows_per_sec"]
            .as_f64()
            .with_context(|| format!("no rows_per_sec in {out}"))
    }

    /// Commit → task start at `rate` jobs/s for `seconds`; returns (p50, p99) in ms and how many
    /// jobs were timed.
    pub fn latency(&self, rate: u64, seconds: u64) -> Result<(f64, f64, u64)> {
        let out = self.script(
            "graphile-worker-latency.js",
            &[("RATE", rate.to_string()), ("SECS", seconds.to_string())],
        )?;
        let field = |k: &str| out[k].as_f64().with_context(|| format!("no {k} in {out}"));
        Ok((field("p50_ms")?, field("p99_ms")?, field("timed")? as u64))
    }
}

/// The uptime's load averages, printed beside each figure (the machine is shared).
pub(crate) fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "n/a".to_owned())
}

/// The median of some figures (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Drains `rows` with the relay at its defaults and with the peer, alternately, `rounds` times
/// each; prints every figure, the medians and their ratio.
pub async fn compare_drain(
    peer: Peer,
    db: &TestDb,
    admin: &ConnInfo,
    rows: i64,
    rounds: usize,
) -> Result<()> {
    let Peer::GraphileWorker = peer;
    let Some(worker) = GraphileWorker::prepare(admin).await? else {
        return Ok(());
    };
    println!(
        "side by side: {rows} no-op rows drained, the relay at its defaults (RelayConfig::default()) \
         and graphile-worker (local queue 500, concurrency 24), alternately, same server"
    );
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=rounds.max(1) {
        let o = crate::relay::default_relay_drain(db, rows).await?;
        println!(
            "  round {round}: txoutbox relay   {o:>9.0} rows/s   (load {})",
            load()
        );
        ours.push(o);
        let t = tokio::task::block_in_place(|| worker.drain(rows))?;
        println!(
            "  round {round}: graphile-worker  {t:>9.0} rows/s   (load {})",
            load()
        );
        theirs.push(t);
    }
    let (o, t) = (median(ours), median(theirs));
    println!(
        "drain, median of {rounds}: txoutbox {o:.0} rows/s, graphile-worker {t:.0} rows/s: \
         {:.2}x graphile-worker",
        o / t
    );
    println!(
        "    $ cargo run --release -p txoutbox-bench -- relay --rows {rows} --peer graphile-worker \
         --rounds {rounds}"
    );
    Ok(())
}

/// Commit → sink latency of the relay at its defaults and of the peer at the same rate,
/// alternately, `args.rounds` times each; prints every figure and the medians.
pub async fn compare_latency(
    peer: Peer,
    db: &TestDb,
    admin: &ConnInfo,
    args: &crate::latency::LatencyArgs,
) -> Result<()> {
    let Peer::GraphileWorker = peer;
    let Some(worker) = GraphileWorker::prepare(admin).await? else {
        return Ok(());
    };
    let (mut ours, mut theirs) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for round in 1..=args.rounds.max(1) {
        let o = crate::latency::measure(db, args).await?;
        println!(
            "  round {round}: txoutbox relay   p50_ms {:.2} p99_ms {:.2} (timed {} of {}, load {})",
            o.p50_ms,
            o.p99_ms,
            o.timed,
            o.sent,
            load()
        );
        ours.0.push(o.p50_ms);
        ours.1.push(o.p99_ms);
        let (p50, p99, timed) =
            tokio::task::block_in_place(|| worker.latency(args.rate, args.seconds))?;
        println!(
            "  round {round}: graphile-worker  p50_ms {p50:.2} p99_ms {p99:.2} (timed {timed} of {}, load {})",
            args.rate * args.seconds,
            load()
        );
        theirs.0.push(p50);
        theirs.1.push(p99);
    }
    println!(
        "latency, median of {}: txoutbox p50_ms {:.2} p99_ms {:.2}; graphile-worker p50_ms {:.2} \
         p99_ms {:.2}",
        args.rounds,
        median(ours.0),
        median(ours.1),
        median(theirs.0),
        median(theirs.1)
    );
    println!(
        "    $ cargo run --release -p txoutbox-bench -- latency --rate {} --seconds {} --peer \
         graphile-worker --rounds {}",
        args.rate, args.seconds, args.rounds
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
