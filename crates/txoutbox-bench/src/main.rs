//! `txoutbox-bench`: throughput of txoutbox's paths against raw-SQL baselines measured in the same
//! run, on the same database. Reads `DATABASE_URL`; without it, starts a throwaway cluster with
//! production durability (fsync on).

mod relay;
mod write;

use anyhow::Result;
use clap::{Parser, Subcommand};
use txoutbox_test_support::{Cluster, ClusterOptions, ConnInfo, TestDb};

#[derive(Debug, Parser)]
#[command(
    name = "txoutbox-bench",
    about = "txoutbox benchmarks, as ratios to a baseline"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write path: business insert alone vs key + insert + 2 outbox rows + stored response.
    Write(write::Args),
    /// Relay drain: a raw-SQL drain loop vs the relay with a no-op sink, same backlog.
    Relay(relay::DrainArgs),
    /// Commit → sink latency at a steady offered load.
    Latency(relay::LatencyArgs),
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let (_cluster, admin) = server()?;
    let db = TestDb::create_on(&admin).await?;
    match cli.command {
        Command::Write(args) => write::run(&db, &args).await,
        Command::Relay(args) => relay::run_drain(&db, &args).await,
        Command::Latency(args) => relay::run_latency(&db, &args).await,
    }
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
