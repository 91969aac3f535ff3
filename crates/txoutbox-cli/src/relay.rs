//! `txoutbox relay`: the relay as its own process. Flags (or their env variables) set the
//! relay's knobs and register the built-in sinks; SIGINT/SIGTERM stop it gracefully.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use txoutbox::{
    admin::destination_matches,
    relay::{
        DestinationPolicy, Relay, RelayBuilder, RelayConfig, RetryPolicy, Semantics, WakeMode,
    },
    sink::{Delivery, DeliveryError, Receipt, Sink},
};
use txoutbox_axum::health::MetricsServer;

/// Options of `txoutbox relay`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    DATABASE_URL=postgres://app@db/app SMTP_URL=smtp://mail:25 STRIPE_SECRET_KEY=sk_live_... txoutbox relay\n  \
    txoutbox relay --mail-dir /var/mail/outbox --webhook webhook:orders=https://example.com/hooks --webhook-secret whsec_...\n  \
    txoutbox relay --nats-url nats://127.0.0.1:4222 --at-most-once sms\n  \
    txoutbox relay --poll-only --poll-interval 200ms --concurrency 128 --stdout audit")]
pub struct RelayArgs {
    /// Rows claimed per claim statement at most (claims are sized by the pace of the sink calls).
    #[arg(long, env = "TXOUTBOX_BATCH_SIZE", default_value_t = 500)]
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
    /// How often this relay refreshes its row in `txoutbox relays` (three missed: stale).
    #[arg(long, env = "TXOUTBOX_HEARTBEAT", default_value = "5s", value_parser = humantime::parse_duration)]
    heartbeat: Duration,
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
    /// Deliver `email` rows through this SMTP server (smtp://host:port, smtps://, user:pass@).
    #[arg(long, env = "SMTP_URL", conflicts_with = "mail_dir")]
    smtp_url: Option<String>,
    /// The name the `email` sink gives in EHLO: this host's fully qualified name or an address
    /// literal ([192.0.2.1]). Default: the host name if it has a dot, else its name in
    /// /etc/hosts, else the literal of the local address towards the SMTP server.
    #[arg(long, env = "SMTP_HELO_NAME", value_name = "NAME")]
    smtp_helo_name: Option<String>,
    /// Deliver `email` rows as .eml files into this directory (lettre's file transport).
    #[arg(long, env = "MAIL_DIR")]
    mail_dir: Option<std::path::PathBuf>,
    /// The longest one call of the SMTP, Stripe, webhook and NATS sinks may take (default: each
    /// sink's own: 20 s for SMTP and Stripe, 10 s for webhooks, 5 s for a NATS ack). It must fit
    /// in the lease, with a margin: a relay with a shorter lease than a sink needs is refused.
    #[arg(long, env = "TXOUTBOX_SINK_TIMEOUT", value_parser = humantime::parse_duration)]
    sink_timeout: Option<Duration>,
    /// Deliver `stripe` rows to Stripe with this secret key (sk_... or rk_...).
    #[arg(long, env = "STRIPE_SECRET_KEY", hide_env_values = true)]
    stripe_secret_key: Option<String>,
    /// The Stripe API base URL (a local fake in tests and demos).
    #[arg(long, env = "STRIPE_API_BASE", default_value = txoutbox_stripe::DEFAULT_API_BASE)]
    stripe_api_base: String,
    /// Deliver DESTINATION's rows as Standard Webhooks POSTs to URL (repeatable; env: a
    /// comma-separated list).
    #[arg(long = "webhook", value_name = "DESTINATION=URL", env = "TXOUTBOX_WEBHOOKS", value_delimiter = ',', value_parser = parse_pair)]
    webhooks: Vec<(String, String)>,
    /// The signing secret (whsec_...) of a webhook destination, or of all without their own.
    #[arg(
        long = "webhook-secret",
        value_name = "[DESTINATION=]SECRET",
        env = "TXOUTBOX_WEBHOOK_SECRET",
        value_delimiter = ',',
        hide_env_values = true
    )]
    webhook_secrets: Vec<String>,
    /// Deliver `nats` rows to this NATS server with JetStream (nats://host:port).
    #[arg(long, env = "NATS_URL")]
    nats_url: Option<String>,
    /// At most N calls per second (or minute, hour) to DESTINATION, shared by every relay of the
    /// database (repeatable; `*` matches any text: 'webhook:*=20/s').
    #[arg(long = "rate-limit", value_name = "DESTINATION=N/s", env = "TXOUTBOX_RATE_LIMITS", value_delimiter = ',', value_parser = parse_rate)]
    rate_limits: Vec<(String, txoutbox::relay::RateLimit)>,
    /// At most N calls to DESTINATION in flight at once on this relay (repeatable; `*` globs).
    #[arg(long = "max-in-flight", value_name = "DESTINATION=N", env = "TXOUTBOX_MAX_IN_FLIGHT", value_delimiter = ',', value_parser = parse_in_flight)]
    max_in_flight: Vec<(String, usize)>,
    /// Consecutive retryable failures that open a destination's circuit breaker (0: no breaker;
    /// a downstream throttling most calls still pauses its destination).
    #[arg(long, env = "TXOUTBOX_BREAKER_FAILURES", default_value_t = 10)]
    breaker_failures: u32,
    /// How long an open breaker waits before its first probe (doubled at each opening in a row).
    #[arg(long, env = "TXOUTBOX_BREAKER_COOL_DOWN", default_value = "5s", value_parser = humantime::parse_duration)]
    breaker_cool_down: Duration,
    /// The longest cool-down of an open breaker.
    #[arg(long, env = "TXOUTBOX_BREAKER_MAX_COOL_DOWN", default_value = "5m", value_parser = humantime::parse_duration)]
    breaker_max_cool_down: Duration,
    // Boxed: `Command`'s variants stay of similar size.
    #[command(flatten)]
    observability: Box<ObservabilityArgs>,
}

/// The metrics and health flags of `txoutbox relay`.
#[derive(Debug, clap::Args)]
struct ObservabilityArgs {
    /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` on this address (e.g.
    /// 127.0.0.1:9464). Without it no metrics are recorded.
    #[arg(long, env = "TXOUTBOX_METRICS_ADDR", value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// How often the backlog gauges (pending rows, oldest pending age) are sampled.
    #[arg(long, env = "TXOUTBOX_SAMPLE_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    sample_interval: Duration,
}

fn parse_rate(text: &str) -> Result<(String, txoutbox::relay::RateLimit), String> {
    let (pattern, rate) = split_pair(text, "DESTINATION=N/s")?;
    let rate = rate.parse().map_err(|e: txoutbox::Error| e.to_string())?;
    Ok((pattern.to_owned(), rate))
}

fn parse_in_flight(text: &str) -> Result<(String, usize), String> {
    let (pattern, n) = split_pair(text, "DESTINATION=N")?;
    match n.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok((pattern.to_owned(), n)),
        _ => Err(format!("{text:?}: N must be a whole number above 0")),
    }
}

/// The flow control of `destination` from the flags: the first matching --rate-limit and
/// --max-in-flight, and the breaker.
fn flow_of(args: &RelayArgs, destination: &str) -> txoutbox::relay::FlowControl {
    txoutbox::relay::FlowControl {
        rate_limit: args
            .rate_limits
            .iter()
            .find(|(p, _)| destination_matches(p, destination))
            .map(|(_, r)| *r),
        max_in_flight: args
            .max_in_flight
            .iter()
            .find(|(p, _)| destination_matches(p, destination))
            .map(|(_, n)| *n),
        breaker: (args.breaker_failures > 0).then_some(txoutbox::relay::Breaker {
            failures: args.breaker_failures,
            cool_down: args.breaker_cool_down,
            max_cool_down: args.breaker_max_cool_down,
        }),
    }
}

fn parse_pair(text: &str) -> Result<(String, String), String> {
    let (name, value) = split_pair(text, "DESTINATION=URL")?;
    Ok((name.to_owned(), value.to_owned()))
}

/// `NAME=VALUE`, both non-empty, split at the first `=` (a URL's query may hold more); `form`
/// names the expected shape in the error.
fn split_pair<'a>(text: &'a str, form: &str) -> Result<(&'a str, &'a str), String> {
    text.split_once('=')
        .filter(|(name, value)| !name.is_empty() && !value.is_empty())
        .ok_or_else(|| format!("expected {form}, got {text:?}"))
}

/// Runs the relay until SIGINT or SIGTERM. Exits at start, with the line that says what to run,
/// when the database's schema is not the version this build needs (the relay waits for an
/// unreachable database first).
pub async fn run(url: &str, args: RelayArgs) -> Result<()> {
    // Installed first, so a signal that arrives while the relay is still starting stops it
    // gracefully instead of killing it. One signal stops both the relay and the metrics server.
    let shutdown = txoutbox::relay::Shutdown::on_signal()
        .context("installing the SIGINT and SIGTERM handlers")?;
    let pg = txoutbox::pg::PgConfig::parse(url).context("DATABASE_URL")?;
    // Installed before anything records, so the first deliveries are counted too.
    let prometheus = match args.observability.metrics_addr {
        Some(_) => Some(
            txoutbox_axum::prometheus::install_recorder()
                .context("installing the Prometheus recorder")?,
        ),
        None => None,
    };
    let builder = Relay::builder(pg).config(relay_config(&args));
    let (builder, sinks) = with_sinks(builder, &args).await?;
    anyhow::ensure!(
        !sinks.is_empty(),
        "no sink configured: a relay without sinks would dead-letter every row (see txoutbox relay --help)"
    );
    check_patterns(&args, &sinks)?;
    let relay = with_policies(builder, &args, &sinks).build()?;
    let server = match (args.observability.metrics_addr, prometheus) {
        (Some(addr), Some(handle)) => Some(
            MetricsServer::bind(addr, handle, &relay, args.poll_only)
                .await
                .with_context(|| format!("binding the metrics address {addr}"))?,
        ),
        _ => None,
    };
    tracing::info!(owner = %relay.owner(), sinks = ?sinks, "relay starting");
    let serving = async {
        match server {
            Some(server) => server.run(shutdown.wait()).await,
            None => Ok(()),
        }
    };
    // A relay that ends by itself (a schema this build cannot use) stops the server too. The
    // relay logs its own "relay stopped" with its counts.
    let relaying = async {
        let report = relay.run(shutdown.wait()).await;
        shutdown.trigger();
        report
    };
    let (report, served) = tokio::join!(relaying, serving);
    report?;
    served.context("the metrics server failed")
}

/// The relay's knobs, from the flags.
fn relay_config(args: &RelayArgs) -> RelayConfig {
    let config = RelayConfig::default()
        .with_batch_size(args.batch_size)
        .with_concurrency(args.concurrency)
        .with_lease(args.lease)
        .with_poll_interval(args.poll_interval)
        .with_wake(if args.poll_only {
            WakeMode::PollOnly
        } else {
            WakeMode::ListenAndPoll
        })
        .with_shutdown_grace(args.shutdown_grace)
        .with_sample_interval(args.observability.sample_interval)
        .with_heartbeat_interval(args.heartbeat);
    match &args.owner {
        Some(owner) => config.with_owner(owner.clone()),
        None => config,
    }
}

/// Registers the built-in sinks the flags configure; also answers their destinations.
async fn with_sinks(
    mut builder: RelayBuilder,
    args: &RelayArgs,
) -> Result<(RelayBuilder, Vec<String>)> {
    let mut sinks = Vec::new();
    for destination in &args.stdout {
        builder = builder.sink(destination.clone(), StdoutSink);
        sinks.push(destination.clone());
    }
    if let Some(sink) = email_sink(args)? {
        builder = builder.sink(txoutbox_email::DESTINATION, sink);
        sinks.push(txoutbox_email::DESTINATION.to_owned());
    }
    if let Some(key) = &args.stripe_secret_key {
        let mut sink = txoutbox_stripe::StripeSink::new(key.clone())
            .and_then(|s| s.with_api_base(&args.stripe_api_base))
            .context("Stripe configuration")?;
        if let Some(timeout) = args.sink_timeout {
            sink = sink.with_timeout(timeout);
        }
        builder = builder.sink(txoutbox_stripe::DESTINATION, sink);
        sinks.push(txoutbox_stripe::DESTINATION.to_owned());
    }
    for (destination, url) in &args.webhooks {
        let secret = webhook_secret(&args.webhook_secrets, destination)?;
        let defaults = txoutbox_webhook::WebhookConfig::default();
        let config = txoutbox_webhook::WebhookConfig {
            timeout: args.sink_timeout.unwrap_or(defaults.timeout),
            connect_timeout: args.sink_timeout.map_or(defaults.connect_timeout, |t| {
                t.min(defaults.connect_timeout)
            }),
            ..defaults
        };
        let sink = txoutbox_webhook::WebhookSink::with_config(url, secret, config)
            .with_context(|| format!("webhook {destination}"))?;
        builder = builder.sink(destination.clone(), sink);
        sinks.push(destination.clone());
    }
    if let Some(url) = &args.nats_url {
        let sink = tokio::time::timeout(
            Duration::from_secs(10),
            txoutbox_nats::NatsSink::connect(url),
        )
        .await
        .with_context(|| format!("connecting to NATS at {url}: timed out"))?
        .with_context(|| format!("connecting to NATS at {url}"))?;
        let sink = match args.sink_timeout {
            Some(timeout) => sink.with_ack_timeout(timeout),
            None => sink,
        };
        builder = builder.sink(txoutbox_nats::DESTINATION, sink);
        sinks.push(txoutbox_nats::DESTINATION.to_owned());
    }
    Ok((builder, sinks))
}

/// The email sink: SMTP when `--smtp-url` is given, else `.eml` files when `--mail-dir` is.
fn email_sink(args: &RelayArgs) -> Result<Option<txoutbox_email::EmailSink>> {
    if let Some(url) = &args.smtp_url {
        let defaults = txoutbox_email::SmtpConfig::default();
        let config = txoutbox_email::SmtpConfig {
            hello_name: args.smtp_helo_name.clone(),
            timeout: args.sink_timeout.unwrap_or(defaults.timeout),
            ..defaults
        };
        let setting = match config.hello_name {
            Some(_) => "SMTP_URL, SMTP_HELO_NAME",
            None => "SMTP_URL",
        };
        return Ok(Some(
            txoutbox_email::EmailSink::smtp_with(url, config).context(setting)?,
        ));
    }
    match &args.mail_dir {
        Some(dir) => Ok(Some(
            txoutbox_email::EmailSink::file_dir(dir).context("MAIL_DIR")?,
        )),
        None => Ok(None),
    }
}

/// Refuses a `--rate-limit` or `--max-in-flight` pattern that matches none of `sinks`.
fn check_patterns(args: &RelayArgs, sinks: &[String]) -> Result<()> {
    for (flag, pattern) in args
        .rate_limits
        .iter()
        .map(|(p, _)| ("--rate-limit", p))
        .chain(
            args.max_in_flight
                .iter()
                .map(|(p, _)| ("--max-in-flight", p)),
        )
    {
        anyhow::ensure!(
            sinks.iter().any(|d| destination_matches(pattern, d)),
            "{flag} {pattern}: no destination of this relay matches (its sinks: {})",
            sinks.join(", ")
        );
    }
    Ok(())
}

/// Gives every destination its whole policy: retry, semantics and flow control (an
/// at-most-once destination without a sink here keeps its semantics for the rows this relay
/// dead-letters).
fn with_policies(mut builder: RelayBuilder, args: &RelayArgs, sinks: &[String]) -> RelayBuilder {
    let retry = RetryPolicy {
        base: args.retry_base,
        cap: args.retry_cap,
        max_attempts: args.max_attempts,
    };
    builder = builder.default_policy(DestinationPolicy {
        retry: retry.clone(),
        semantics: Semantics::AtLeastOnce,
        flow: flow_of(args, ""),
    });
    for destination in args.at_most_once.iter().filter(|d| !sinks.contains(d)) {
        builder = builder.policy(
            destination.clone(),
            DestinationPolicy {
                retry: retry.clone(),
                semantics: Semantics::AtMostOnce,
                flow: flow_of(args, destination),
            },
        );
    }
    for destination in sinks {
        let semantics = if args
            .at_most_once
            .iter()
            .any(|p| destination_matches(p, destination))
        {
            Semantics::AtMostOnce
        } else {
            Semantics::AtLeastOnce
        };
        builder = builder.policy(
            destination.clone(),
            DestinationPolicy {
                retry: retry.clone(),
                semantics,
                flow: flow_of(args, destination),
            },
        );
    }
    builder
}

/// The secret given for `destination` (`DESTINATION=SECRET`), else the one given without a name.
fn webhook_secret(
    secrets: &[String],
    destination: &str,
) -> Result<txoutbox_webhook::WebhookSecret> {
    let own = secrets.iter().find_map(|s| {
        s.split_once('=')
            .filter(|(name, _)| *name == destination)
            .map(|(_, secret)| secret)
    });
    let shared = secrets
        .iter()
        .find(|s| s.starts_with("whsec_") || !s.contains('='));
    let secret = own
        .or(shared.map(String::as_str))
        .with_context(|| format!("no --webhook-secret for webhook destination {destination}"))?;
    txoutbox_webhook::WebhookSecret::parse(secret)
        .map_err(|e| anyhow::anyhow!("the webhook secret of {destination}: {e}"))
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
