//! `txoutbox relay`: the relay as its own process. Flags (or their env variables) set the
//! relay's knobs and register the built-in sinks; SIGINT/SIGTERM stop it gracefully.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use txoutbox::{
    Delivery, DeliveryError, DestinationPolicy, Receipt, Relay, RelayConfig, RetryPolicy,
    Semantics, Sink, WakeMode,
};

/// Options of `txoutbox relay`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    DATABASE_URL=postgres://app@db/app txoutbox relay --stdout audit\n  \
    txoutbox relay --poll-only --poll-interval 200ms --concurrency 128 --stdout audit")]
pub struct RelayArgs {
    /// Rows claimed per claim statement.
    #[arg(long, env = "TXOUTBOX_BATCH_SIZE", default_value_t = 100)]
    batch_size: usize,
    /// Deliveries in flight at once.
    #[arg(long, env = "TXOUTBOX_CONCURRENCY", default_value_t = 64)]
    concurrency: usize,
    /// How long a claim is this relay's (must exceed the slowest sink's timeout).
    #[arg(long, env = "TXOUTBOX_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// Fallback poll period when no wake-up hint arrives.
    #[arg(long, env = "TXOUTBOX_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    poll_interval: Duration,
    /// Poll only, no LISTEN (behind PgBouncer in transaction mode).
    #[arg(long, env = "TXOUTBOX_POLL_ONLY")]
    poll_only: bool,
    /// At shutdown, how long in-flight deliveries may take to finish.
    #[arg(long, env = "TXOUTBOX_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
    /// This relay's name in leases and the attempt log (default: host-pid-random).
    #[arg(long, env = "TXOUTBOX_RELAY_OWNER")]
    owner: Option<String>,
    /// Attempts before a row is dead-lettered.
    #[arg(long, env = "TXOUTBOX_MAX_ATTEMPTS", default_value_t = 12)]
    max_attempts: u32,
    /// The first retry's ceiling (full-jitter exponential backoff).
    #[arg(long, env = "TXOUTBOX_RETRY_BASE", default_value = "500ms", value_parser = humantime::parse_duration)]
    retry_base: Duration,
    /// The longest retry delay.
    #[arg(long, env = "TXOUTBOX_RETRY_CAP", default_value = "15m", value_parser = humantime::parse_duration)]
    retry_cap: Duration,
    /// Destinations whose downstream cannot deduplicate (repeatable): a cut-short attempt goes
    /// to `unknown` instead of being delivered again.
    #[arg(long = "at-most-once", value_name = "DESTINATION")]
    at_most_once: Vec<String>,
    /// Deliver DESTINATION's rows as JSON lines on standard output (repeatable).
    #[arg(long = "stdout", value_name = "DESTINATION")]
    stdout: Vec<String>,
}

/// Runs the relay until SIGINT or SIGTERM.
pub async fn run(url: &str, args: RelayArgs) -> Result<()> {
    let pg: tokio_postgres::Config = url.parse().context("parsing DATABASE_URL")?;
    let mut config = RelayConfig {
        batch_size: args.batch_size,
        concurrency: args.concurrency,
        lease: args.lease,
        poll_interval: args.poll_interval,
        wake: if args.poll_only {
            WakeMode::PollOnly
        } else {
            WakeMode::ListenAndPoll
        },
        shutdown_grace: args.shutdown_grace,
        ..RelayConfig::default()
    };
    if let Some(owner) = args.owner {
        config.owner = owner;
    }
    let retry = RetryPolicy {
        base: args.retry_base,
        cap: args.retry_cap,
        max_attempts: args.max_attempts,
    };
    let mut builder = Relay::builder(pg)
        .config(config)
        .default_policy(DestinationPolicy {
            retry: retry.clone(),
            semantics: Semantics::AtLeastOnce,
        });
    for destination in &args.at_most_once {
        builder = builder.policy(
            destination.clone(),
            DestinationPolicy {
                retry: retry.clone(),
                semantics: Semantics::AtMostOnce,
            },
        );
    }
    let mut sinks = 0;
    for destination in &args.stdout {
        builder = builder.sink(destination.clone(), StdoutSink);
        sinks += 1;
    }
    anyhow::ensure!(
        sinks > 0,
        "no sink configured: a relay without sinks would dead-letter every row (see txoutbox relay --help)"
    );
    let relay = builder.build()?;
    tracing::info!(owner = %relay.owner(), "relay starting");
    let report = relay.run(shutdown_signal()).await?;
    tracing::info!(
        claimed = report.claimed,
        released = report.released,
        "relay stopped"
    );
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Writes each delivery as one JSON line on standard output: for audit trails, debugging and
/// piping into other tools.
struct StdoutSink;

#[async_trait::async_trait]
impl Sink for StdoutSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let line = serde_json::json!({
            "id": delivery.id,
            "destination": delivery.destination,
            "downstream_key": delivery.downstream_key,
            "attempt": delivery.attempt,
            "ordering_key": delivery.ordering_key,
            "headers": delivery.headers,
            "payload": delivery.payload,
        });
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|_| out.flush())
            .map_err(|e| DeliveryError::retryable(format!("writing to stdout: {e}")))?;
        Ok(Receipt::none())
    }
}
