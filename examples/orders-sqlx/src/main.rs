//! `orders-sqlx`: serves `POST /orders` and `GET /orders/{id}` until SIGTERM or ctrl-c.

use txoutbox::telemetry::logs::{LogFormat, LOG_FORMAT_ENV};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let format = match std::env::var(LOG_FORMAT_ENV) {
        Ok(text) => text.parse()?,
        Err(_) => LogFormat::Text,
    };
    txoutbox::telemetry::logs::init(format, "info")?;
    let settings = orders_sqlx::Settings::from_env()?;
    // Installed before migrating, so a signal during start stops the service cleanly.
    let shutdown = txoutbox::relay::Shutdown::on_signal()?;
    orders_sqlx::serve(settings, shutdown.wait()).await
}
