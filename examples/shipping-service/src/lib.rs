//! The shipping service of the demo's chain: `POST /webhooks` receives the charge service's
//! Standard Webhooks; a verified `charge.succeeded` event (`data.charge_id`, `data.email`)
//! inserts one row in `shipments` and enqueues one "your order ships" email through the
//! service's own outbox, in one transaction with its inbox record (keyed by `webhook-id`), so
//! every redelivery of one webhook makes one shipment and one email.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let settings = shipping_service::Settings::from_env()?; // DATABASE_URL, BIND, WEBHOOK_SECRET
//! let shutdown = txoutbox::relay::Shutdown::on_signal()?; // SIGTERM or ctrl-c
//! shipping_service::serve(settings, shutdown.wait()).await?;
//! # Ok(()) }
//! ```
//!
//! Layout: `http` holds the route, its handler and the `CRASH_AT` failure point; this file the
//! settings, the migrations (txoutbox's, then the service's own `migrations/`), the relay (the
//! email sink) and [`serve`].

mod http;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;

pub use http::{router, App, CrashPoint, CONSUMER, EVENT_TYPE, MAX_BODY_BYTES};

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The table refinery records the service's own migrations in (txoutbox's has its own).
pub const HISTORY_TABLE: &str = "shipping_service_schema_history";

/// The advisory lock the service's migrations run under ("shipsvc!" in ASCII).
const MIGRATION_LOCK: i64 = 0x7368_6970_7376_6321;

/// The address served when `BIND` is not set.
pub const DEFAULT_BIND: &str = "127.0.0.1:3001";

/// How the service is configured (from the environment in `main`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Postgres (`DATABASE_URL`, a URL or key=value string).
    pub database_url: String,
    /// Where to listen (`BIND`, default [`DEFAULT_BIND`]).
    pub bind: SocketAddr,
    /// The secrets a webhook may be signed with (`WEBHOOK_SECRET`: one `whsec_` secret, or
    /// several separated by spaces or commas while one is rotated).
    pub webhook_secrets: Vec<String>,
    /// Run the relay (the shipping emails) in this process (default).
    pub relay: bool,
    /// The failure point to abort at (`CRASH_AT`), for crash tests and the demo.
    pub crash_at: Option<CrashPoint>,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Settings {
    /// `DATABASE_URL` and `WEBHOOK_SECRET` (required), `BIND`, `CRASH_AT`; the relay on. Mail
    /// settings (`SMTP_URL` or `MAIL_DIR`) are read by the email sink when the relay starts.
    pub fn from_env() -> anyhow::Result<Self> {
        let database_url = var("DATABASE_URL").context("DATABASE_URL is not set")?;
        let secrets = var("WEBHOOK_SECRET").context("WEBHOOK_SECRET is not set")?;
        let bind = var("BIND").unwrap_or_else(|| DEFAULT_BIND.into());
        let crash_at = match var("CRASH_AT") {
            Some(point) => Some(point.parse()?),
            None => None,
        };
        Ok(Self {
            database_url,
            bind: bind.parse().with_context(|| format!("BIND={bind}"))?,
            webhook_secrets: split_secrets(&secrets),
            relay: true,
            crash_at,
        })
    }
}

/// The secrets of `WEBHOOK_SECRET`: separated by spaces or commas.
pub fn split_secrets(value: &str) -> Vec<String> {
    value
        .split([' ', ','])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Applies txoutbox's migrations, then the service's own, each under an advisory lock so that
/// instances starting at once apply them once.
pub async fn migrate(pg: &txoutbox::pg::PgConfig) -> anyhow::Result<()> {
    let runner = embedded::migrations::runner();
    example_support::migrate(
        pg,
        runner,
        HISTORY_TABLE,
        MIGRATION_LOCK,
        "shipping-service",
    )
    .await
}

/// The relay with the email sink (from the environment: `SMTP_URL`, else `MAIL_DIR`), each
/// delivery bounded well below the lease.
pub fn relay(pg: &txoutbox::pg::PgConfig) -> anyhow::Result<txoutbox::relay::Relay> {
    let email = txoutbox_email::EmailSink::from_env_with(txoutbox_email::SmtpConfig {
        timeout: Duration::from_secs(5),
        ..txoutbox_email::SmtpConfig::default()
    })
    .context("the relay's email sink (SMTP_URL or MAIL_DIR)")?;
    Ok(txoutbox::relay::Relay::builder(pg.clone())
        .config(example_support::relay_config())
        .sink(txoutbox_email::DESTINATION, email)
        .build()?)
}

/// Migrates, then serves HTTP (and runs the relay unless `settings.relay` is off) until
/// `shutdown` resolves.
pub async fn serve(settings: Settings, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let pg = txoutbox::pg::PgConfig::parse(&settings.database_url).context("DATABASE_URL")?;
    let app = App::new(
        example_support::pool(&pg, 32)?,
        settings.webhook_secrets.iter().map(String::as_str),
        settings.crash_at,
    )?;
    migrate(&pg).await?;
    let relay = if settings.relay {
        Some(relay(&pg)?)
    } else {
        None
    };
    let routes = router(app);
    example_support::serve(settings.bind, "shipping-service", routes, relay, shutdown).await
}
