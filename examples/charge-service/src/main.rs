//! `charge-service`: serve (with the relay in-process unless `--no-relay`), or `--demo`.

use clap::Parser;

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.demo {
        return charge_service::run_demo().await;
    }
    let mut settings = charge_service::Settings::from_env()?;
    settings.relay = !args.no_relay;
    settings.metrics = Some(txoutbox_axum::prometheus::install_recorder()?);
    let shutdown = txoutbox::relay::Shutdown::on_signal()?;
    charge_service::serve(settings, shutdown.wait()).await
}
