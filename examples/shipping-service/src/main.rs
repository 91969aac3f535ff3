//! `shipping-service`: serve `POST /webhooks` (with the relay in-process).

use txoutbox::telemetry::logs::{LogFormat, LOG_FORMAT_ENV};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let format = std::env::var(LOG_FORMAT_ENV)
        .ok()
        .and_then(|f| f.parse().ok())
        .unwrap_or(LogFormat::Text);
    txoutbox::telemetry::logs::init(format, "warn")?;
    let settings = shipping_service::Settings::from_env()?;
    let shutdown = txoutbox::relay::Shutdown::on_signal()?;
    shipping_service::serve(settings, shutdown.wait()).await
}
