//! The `txoutbox` command: applies the schema and (in later commands) runs the relay and the
//! operator's tools. Thin: it parses arguments and calls the core library.

mod admin;
mod dashboard;
#[cfg(feature = "otel")]
mod otel;
mod relay;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser as _};
use clap::{Parser, Subcommand};
use txoutbox::telemetry::logs::{LogFormat, LOG_FORMAT_ENV};

/// The summary `txoutbox --help` opens with: every command, by what it is for (a test checks
/// that it names each one).
const ABOUT: &str = "txoutbox: a transactional outbox for Postgres. Apply the schema (migrate), \
     deliver the outbox (relay), watch and repair it from a browser (dashboard) or from here \
     (list, show, replay, discard, purge, stats, pause, resume, relays).";

/// txoutbox: a transactional outbox for Postgres.
#[derive(Debug, Parser)]
#[command(name = "txoutbox", version, about = ABOUT, long_about = None)]
struct Cli {
    /// Postgres connection string (URL or key=value form, with libpq's sslmode, sslrootcert,
    /// sslcert, sslkey; the PG* environment variables fill in what it leaves out).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

    /// How log lines are written to stderr: text (coloured on a terminal unless NO_COLOR is
    /// set) or json (one object a line, with the fields of the delivery it concerns).
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
    /// Apply txoutbox's migrations (idempotent: running it twice is a no-op).
    ///
    /// Example: DATABASE_URL=postgres://app@localhost/app txoutbox migrate
    Migrate,
    /// Deliver outbox rows to their sinks until SIGINT/SIGTERM (many relays may run at once).
    Relay(Box<relay::RelayArgs>),
    /// Serve the operator dashboard (pages and JSON API) until SIGINT/SIGTERM.
    ///
    /// Example: txoutbox dashboard --addr 0.0.0.0:9470 --user alice:s3cret:operator
    Dashboard(dashboard::DashboardArgs),
    #[command(flatten)]
    Admin(admin::AdminCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let registry = tracing_subscriber::registry()
        .with(txoutbox::telemetry::logs::layer(cli.log_format, "info"));
    // Declared before the runtime, so that it is dropped (flushing the spans) after it.
    #[cfg(feature = "otel")]
    let _export = match otel::layer() {
        Ok(Some((layer, export))) => {
            registry.with(layer).init();
            Some(export)
        }
        Ok(None) => {
            registry.init();
            None
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    #[cfg(not(feature = "otel"))]
    registry.init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<Usage>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// An argument refused after parsing (a destination nothing names): exit 2, as clap's own usage
/// errors, where a failure to do what was asked is 1.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

async fn run(cli: Cli) -> Result<()> {
    let url = cli
        .database_url
        .context("no database: set DATABASE_URL or pass --database-url")?;
    match cli.command {
        Command::Migrate => {
            let mut client = connect(&url).await?;
            let applied = txoutbox::migrate(&mut client).await?;
            if applied.is_empty() {
                println!("schema up to date");
            } else {
                println!("applied migrations {applied:?}");
            }
            Ok(())
        }
        Command::Relay(args) => relay::run(&url, *args).await,
        Command::Dashboard(args) => dashboard::run(&url, args).await,
        Command::Admin(command) => admin::run(&url, command).await,
    }
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let pg = txoutbox::pg::PgConfig::parse(url).context("DATABASE_URL")?;
    let (client, connection) = pg
        .connect()
        .await
        .context("cannot connect to the database")?;
    tokio::spawn(txoutbox::pg::drive(connection));
    Ok(client)
}
