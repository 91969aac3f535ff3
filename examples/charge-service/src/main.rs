//! `charge-service`: serve (with the relay in-process unless `--no-relay`), or `--demo`.

use clap::builder::{PossibleValuesParser, TypedValueParser as _};
use clap::Parser;
use txoutbox::telemetry::logs::{LogFormat, LOG_FORMAT_ENV};

/// The POST /charge service on txoutbox.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Serve HTTP only; `txoutbox relay` processes deliver the outbox.
    #[arg(long)]
    no_relay: bool,
    /// Play the story with a throwaway Postgres, the fake Stripe and a mail directory (or the
    /// DATABASE_URL / STRIPE_* / SMTP_URL / MAIL_DIR given), then exit.
    #[arg(long)]
    demo: bool,
    /// With --demo: keep the service, its dashboard and the throwaway Postgres up after the
    /// story until Ctrl-C, and print the DATABASE_URL for `txoutbox stats`, `list`, `dashboard`.
    #[arg(long, requires = "demo")]
    keep: bool,
    /// How log lines are written to stderr: text (coloured on a terminal unless NO_COLOR is
    /// set) or json (one object a line).
    #[arg(
        long,
        env = LOG_FORMAT_ENV,
        value_name = "FORMAT",
        default_value = "text",
        value_parser = PossibleValuesParser::new(["text", "json"]).try_map(|v| v.parse::<LogFormat>())
    )]
    log_format: LogFormat,
    /// Run the shipping service instead (the demo's next hop, started by `--demo` as a child
    /// process): DATABASE_URL, BIND, WEBHOOK_SECRET, CRASH_AT as `shipping-service` reads them.
    #[arg(long, hide = true, conflicts_with = "demo")]
    shipping_service: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    txoutbox::telemetry::logs::init(args.log_format, "warn")?;
    if args.shipping_service {
        let settings = shipping_service::Settings::from_env()?;
        let shutdown = txoutbox::relay::Shutdown::on_signal()?;
        return shipping_service::serve(settings, shutdown.wait()).await;
    }
    if args.demo {
        return charge_service::run_demo(args.keep).await;
    }
    let mut settings = charge_service::Settings::from_env()?;
    settings.relay = !args.no_relay;
    settings.metrics = Some(txoutbox_axum::prometheus::install_recorder()?);
    let shutdown = txoutbox::relay::Shutdown::on_signal()?;
    charge_service::serve(settings, shutdown.wait()).await
}
