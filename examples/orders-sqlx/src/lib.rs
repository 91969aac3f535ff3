//! An order service on axum and sqlx: `POST /orders` writes an order, a receipt email and an
//! `order.created` webhook in one sqlx transaction under the request's `Idempotency-Key`;
//! `txoutbox relay` delivers the two effects.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let settings = orders_sqlx::Settings::from_env()?;          // DATABASE_URL, BIND
//! let shutdown = txoutbox::relay::Shutdown::on_signal()?;     // SIGTERM or ctrl-c
//! orders_sqlx::serve(settings, shutdown.wait()).await?;
//! # Ok(()) }
//! ```
//!
//! Layout: `http` holds the routes, the handlers and the checks of an order; `queries` every
//! statement on the service's table. `migrations/` holds that table, applied by sqlx's
//! migrator after txoutbox's own migrations ([`migrate`]).

mod http;
mod queries;

use std::future::Future;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

pub use http::{router, App, MAX_AMOUNT, MAX_BODY_BYTES};

/// Where the service listens when `BIND` is not set.
pub const DEFAULT_BIND: &str = "127.0.0.1:3002";

/// The service's own migrations (`migrations/`, embedded at build time; history in
/// `_sqlx_migrations`, where the `sqlx migrate` command keeps it too).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How the service is configured (from the environment in `main`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Postgres (`DATABASE_URL`, a `postgres://` URL as sqlx reads it).
    pub database_url: String,
    /// Where to listen (`BIND`, default [`DEFAULT_BIND`]).
    pub bind: SocketAddr,
    /// Abort the process after an order's commit, before its answer is sent (`CRASH_AT=after_commit`):
    /// for the tests that kill the service there and retry.
    pub crash_after_commit: bool,
}

impl Settings {
    /// `DATABASE_URL` (required), `BIND`, `CRASH_AT`.
    pub fn from_env() -> anyhow::Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let database_url = var("DATABASE_URL").context("DATABASE_URL is not set")?;
        let bind = var("BIND").unwrap_or_else(|| DEFAULT_BIND.into());
        let crash_after_commit = match var("CRASH_AT").as_deref() {
            None => false,
            Some("after_commit") => true,
            Some(other) => anyhow::bail!("CRASH_AT={other}: the only point is after_commit"),
        };
        Ok(Self {
            database_url,
            bind: bind.parse().with_context(|| format!("BIND={bind}"))?,
            crash_after_commit,
        })
    }
}

/// The HTTP pool over `database_url`: bounded waits, so an unreachable Postgres is a quick 503
/// rather than a hang. Connects lazily: the first request (or [`migrate`]) opens a connection.
pub fn pool(database_url: &str, size: u32) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(database_url).context("DATABASE_URL")?;
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options))
}

/// Applies txoutbox's migrations (`txoutbox::migrate_sqlx`), then the service's own
/// ([`MIGRATOR`]), each under its advisory lock, so instances starting at once apply each once.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await.context("connecting to Postgres")?;
    txoutbox::migrate_sqlx(&mut conn)
        .await
        .context("applying txoutbox's migrations")?;
    MIGRATOR
        .run(&mut *conn)
        .await
        .context("applying the orders-sqlx migrations")?;
    Ok(())
}

/// Migrates, then serves HTTP until `shutdown` resolves; requests under way are finished first.
pub async fn serve(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let pool = pool(&settings.database_url, 16)?;
    migrate(&pool).await?;
    let app = App::new(pool.clone(), settings.crash_after_commit)?;
    example_support::serve(settings.bind, "orders-sqlx", router(app), None, shutdown).await?;
    pool.close().await;
    Ok(())
}
