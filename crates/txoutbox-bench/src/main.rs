//! `txoutbox-bench`: throughput of txoutbox's paths against raw-SQL baselines measured in the same
//! run, on the same database. Reads `DATABASE_URL`; without it, starts a throwaway cluster with
//! production durability (fsync on). `soak` starts a private cluster of its own.

mod dashboard;
mod flow;
mod inbox;
mod latency;
mod peer;
mod ratio;
mod relay;
mod write;

use std::process::ExitCode;

use anyhow::Result;
use clap::builder::{PossibleValuesParser, TypedValueParser as _};
use clap::{Parser, Subcommand};
use txoutbox::telemetry::logs::{LogFormat, LOG_FORMAT_ENV};
use txoutbox_test_support::{Cluster, ClusterOptions, ConnInfo, TestDb};

#[derive(Debug, Parser)]
#[command(
    name = "txoutbox-bench",
    about = "txoutbox benchmarks, as ratios to a baseline"
)]
struct Cli {
    /// How log lines are written to stderr: text (coloured on a terminal unless NO_COLOR is
    /// set) or json (one object a line).
    #[arg(
        long,
        env = LOG_FORMAT_ENV,
        global = true,
        value_name = "FORMAT",
        default_value = "text",
        value_parser = PossibleValuesParser::new(["text", "json"]).try_map(|v| v.parse::<LogFormat>())
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write path: business insert alone and hand-written SQL storing the same information vs
    /// key + insert + 2 outbox rows + stored response.
    Write(write::Args),
    /// Relay drain: a raw-SQL drain loop, a single-statement delete drain and the relay with a
    /// no-op sink, same backlog; the relay's memory; its drain behind failed ordering heads and
    /// over delivered history.
    Relay(relay::DrainArgs),
    /// Commit → sink latency at a steady offered load.
    Latency(latency::LatencyArgs),
    /// Dashboard pages and API answers, p50/p99 each, over a large outbox.
    Dashboard(dashboard::Args),
    /// Flow control: a backlog to a rate-limited downstream, with and without a rate limit.
    Flow(flow::Args),
    /// The inbox: a receiving handler (one row and one onward effect a message) with and
    /// without `inbox::receive`.
    Inbox(inbox::Args),
    /// Fault-injection soak: relay processes, Postgres and a scripted downstream under faults
    /// drawn from a seed; checks the delivery invariants at the end (exit 1 on a violation).
    Soak(SoakArgs),
}

/// Options of `txoutbox-bench soak`.
#[derive(Debug, clap::Args)]
struct SoakArgs {
    /// The fault plan's seed (default: a random one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Minutes of faults (adds to --seconds).
    #[arg(long, default_value_t = 0)]
    minutes: u64,
    /// Seconds of faults (default 60 when --minutes is not given).
    #[arg(long)]
    seconds: Option<u64>,
    /// Rows enqueued over the run.
    #[arg(long, default_value_t = 1000)]
    rows: usize,
    /// Relay processes.
    #[arg(long, default_value_t = 3)]
    relays: usize,
    /// The relays' lease (the webhook sink's 10 s timeout must fit in it, with a margin).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease: std::time::Duration,
    /// Attempts before a row is dead-lettered.
    #[arg(long, default_value_t = 6)]
    max_attempts: u32,
    /// How long the backlog may take to settle once the faults end.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    settle: std::time::Duration,
    /// The `txoutbox` binary (default: the one next to this binary).
    #[arg(long, env = "TXOUTBOX_BIN")]
    txoutbox_bin: Option<std::path::PathBuf>,
    /// Violations printed per invariant (the table counts them all).
    #[arg(long, default_value_t = 20)]
    show: usize,
    /// Where the relays' logs go (default: a new directory under the temp dir).
    #[arg(long)]
    log_dir: Option<std::path::PathBuf>,
    /// Store no undecodable rows (by default about 1 % of the rows are stored with payloads
    /// Postgres accepts and serde_json refuses).
    #[arg(long)]
    no_hostile_rows: bool,
}

#[tokio::main]
async fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    txoutbox::telemetry::logs::init(cli.log_format, "warn")?;
    if let Command::Soak(args) = &cli.command {
        return soak(args).await;
    }
    let (_cluster, admin) = server()?;
    let db = TestDb::create_on(&admin).await?;
    match cli.command {
        Command::Write(args) => write::run(&db, &args).await?,
        Command::Relay(args) => relay::run_drain(&db, &admin, &args).await?,
        Command::Latency(args) => latency::run(&db, &admin, &args).await?,
        Command::Dashboard(args) => dashboard::run(&db, &args).await?,
        Command::Flow(args) => flow::run(&db, &args).await?,
        Command::Inbox(args) => inbox::run(&db, &args).await?,
        Command::Soak(_) => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the soak; exit status 1 when an invariant was violated.
async fn soak(args: &SoakArgs) -> Result<ExitCode> {
    use txoutbox_bench::soak;
    let seed = args.seed.unwrap_or_else(rand::random);
    let bin = match &args.txoutbox_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?.with_file_name("txoutbox"),
    };
    let mut options = soak::SoakOptions::new(seed, bin);
    let seconds = args
        .seconds
        .unwrap_or(if args.minutes == 0 { 60 } else { 0 });
    options.chaos = std::time::Duration::from_secs(args.minutes * 60 + seconds);
    options.rows = args.rows;
    options.relays = args.relays;
    options.lease = args.lease;
    options.max_attempts = args.max_attempts;
    options.settle = args.settle;
    options.log_dir = args.log_dir.clone();
    options.hostile = !args.no_hostile_rows;
    let report = soak::run(&options).await?;
    print!("{}", report.violation_lines(args.show));
    for note in &report.notes {
        println!("note: {note}");
    }
    print!("{}", report.table());
    println!("relay logs: {}", report.log_dir.display());
    if report.violations.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "soak: {} invariant violations (seed {seed})",
        report.violations.len()
    );
    Ok(ExitCode::FAILURE)
}

/// The server to measure on: `DATABASE_URL`'s, or a throwaway cluster kept for this run.
fn server() -> Result<(Option<Cluster>, ConnInfo)> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Ok((None, ConnInfo::parse(&url)?)),
        _ => {
            let cluster = Cluster::private(&ClusterOptions {
                fast: false,
                max_connections: 200,
                ..ClusterOptions::default()
            })?;
            let admin = cluster.admin();
            Ok((Some(cluster), admin))
        }
    }
}
