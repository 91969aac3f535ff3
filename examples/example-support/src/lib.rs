//! What the example services (`charge-service`, `shipping-service`, `orders-sqlx`) share, so
//! that each example shows its own business and not the same set-up three times: their
//! migrations under an advisory lock, their pool, their relay's timing, the checks of a text
//! field and of an amount, the `CRASH_AT` abort, and the serve-until-shutdown loop.
//!
//! ```no_run
//! # async fn demo(routes: axum::Router) -> anyhow::Result<()> {
//! example_support::check_text("email", "ada@example.com", 254).map_err(anyhow::Error::msg)?;
//! let shutdown = txoutbox::relay::Shutdown::on_signal()?;
//! example_support::serve("127.0.0.1:3000".parse()?, "my-service", routes, None, shutdown.wait())
//!     .await
//! # }
//! ```
//!
//! Layout: one file; each item is used by at least two of the services.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use txoutbox::pg::PgConfig;
use txoutbox::relay::{Relay, RelayConfig, Shutdown};

/// Applies txoutbox's migrations, then a service's own (`runner`, recorded in `history_table`)
/// under the advisory lock `lock`, so that instances starting at once apply them once. `service`
/// names the service in the error of a failed migration.
pub async fn migrate(
    pg: &PgConfig,
    mut runner: refinery::Runner,
    history_table: &str,
    lock: i64,
    service: &str,
) -> anyhow::Result<()> {
    let (mut client, connection) = pg.connect().await?;
    tokio::spawn(txoutbox::pg::drive(connection));
    txoutbox::migrate(&mut client).await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&lock])
        .await?;
    let report = runner
        .set_migration_table_name(history_table)
        .run_async(&mut client)
        .await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&lock])
        .await;
    report.with_context(|| format!("applying the {service} migrations"))?;
    unlocked?;
    Ok(())
}

/// The HTTP pool: bounded waits, so an unreachable Postgres is a quick 503 rather than a hang.
pub fn pool(pg: &PgConfig, size: usize) -> anyhow::Result<deadpool_postgres::Pool> {
    Ok(pg
        .pool_builder(size)
        .create_timeout(Some(Duration::from_secs(2)))
        .build()?)
}

/// The in-process relay's lease: a crashed instance's claims come back within seconds, not half
/// a minute.
pub const RELAY_LEASE: Duration = Duration::from_secs(10);

/// The in-process relay's timing: the [`RELAY_LEASE`], a quick poll and reclaim (an example is
/// watched by a person or a test), and a short grace at shutdown.
pub fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .with_lease(RELAY_LEASE)
        .with_poll_interval(Duration::from_millis(250))
        .with_reclaim_interval(Duration::from_millis(500))
        .with_shutdown_grace(Duration::from_secs(3))
}

/// A text field: not blank, at most `max` bytes, no control characters (Postgres text and JSON
/// payloads cannot hold a NUL, and none of the services' fields has a use for one). The error
/// is the problem's detail, naming `field`.
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{field} is empty"));
    }
    if value.len() > max {
        return Err(format!("{field} is longer than {max} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field} contains a control character"));
    }
    Ok(())
}

/// The largest amount accepted, in the currency's smallest unit: Stripe's own limit (eight
/// digits). A larger one is refused with the request, not by Stripe after it is stored.
pub const MAX_AMOUNT: i64 = 99_999_999;

/// An amount in the currency's smallest unit: from 1 to [`MAX_AMOUNT`]. The error is the
/// problem's detail.
pub fn check_amount(amount: i64) -> Result<(), String> {
    if (1..=MAX_AMOUNT).contains(&amount) {
        Ok(())
    } else {
        Err(format!(
            "amount must be from 1 to {MAX_AMOUNT} (in the currency's smallest unit), not {amount}"
        ))
    }
}

/// Serves `routes` on `bind` (and runs `relay`, if any) until `shutdown` resolves, then lets the
/// requests under way and the relay's deliveries finish. Prints `listening on http://ADDR` once
/// bound: scripts and tests wait for that line to know the port.
pub async fn serve(
    bind: SocketAddr,
    service: &str,
    routes: axum::Router,
    relay: Option<Relay>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("binding {bind}"))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, relay = relay.is_some(), "{service} listening");
    println!("listening on http://{addr}");
    // One stop for the relay and the HTTP server, triggered when `shutdown` resolves.
    let stop = Shutdown::new();
    let relay_task = relay.map(|relay| tokio::spawn(relay.run(stop.wait())));
    let server = axum::serve(listener, routes).with_graceful_shutdown(stop.wait());
    let server = tokio::spawn(async move { server.await });
    shutdown.await;
    stop.trigger();
    server.await??;
    if let Some(task) = relay_task {
        task.await??;
    }
    Ok(())
}

/// Aborts the process at the failure point `point` (a `CRASH_AT` value), as a crash there
/// would: no destructor runs, no answer is sent, an open transaction is rolled back by Postgres.
pub fn crash(point: &str) -> ! {
    eprintln!("CRASH_AT={point}: aborting");
    std::process::abort()
}

/// Aborts the process (as [`crash`]) when `point` is the failure point the service was started
/// with (`crash_at`, from `CRASH_AT`); `name` gives a point's `CRASH_AT` value.
pub fn crash_at<P: PartialEq>(crash_at: Option<P>, point: P, name: impl FnOnce(P) -> &'static str) {
    if crash_at.as_ref() == Some(&point) {
        crash(name(point));
    }
}
