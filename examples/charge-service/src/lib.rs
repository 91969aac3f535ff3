//! The charge service of the problem statement: `POST /charge` writes a charge, a Stripe
//! PaymentIntent and a receipt email in one transaction under the request's `Idempotency-Key`;
//! the in-process relay delivers both and marks the charge `succeeded` or `failed`.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let settings = charge_service::Settings::from_env()?;   // DATABASE_URL, BIND, STRIPE_*, SMTP_URL|MAIL_DIR
//! let shutdown = txoutbox::relay::Shutdown::on_signal()?;                 // SIGTERM or ctrl-c
//! charge_service::serve(settings, shutdown.wait()).await?;
//! # Ok(()) }
//! ```
//!
//! Layout: `queries` holds every SQL statement of the service's tables; `http` the routes and
//! handlers (with the `CRASH_AT` failure points); `hook` the relay's completion hook; `page.html`
//! the checkout page; `demo` the one-command story (`charge-service --demo`), and `chain` the
//! shipping service it runs as the chain's next hop. `migrations/` holds
//! the service's own schema, applied after txoutbox's at start.

mod chain;
mod demo;
mod hook;
mod http;
mod queries;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;

pub use demo::{free_addr, reqwest_client, run_demo, ServiceProcess};
pub use hook::{
    shipping_webhook_id, ChargeHook, NoSuchCharge, CHARGE_SUCCEEDED_EVENT, SHIPPING_DESTINATION,
};
pub use http::{router, App, CrashPoint, MAX_AMOUNT, MAX_BODY_BYTES};

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The table refinery records the service's own migrations in (txoutbox's has its own).
pub const HISTORY_TABLE: &str = "charge_service_schema_history";

/// The advisory lock the service's migrations run under ("chargsvc" in ASCII).
const MIGRATION_LOCK: i64 = 0x6368_6172_6773_7663;

/// How the service is configured (from the environment in `main`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Postgres (`DATABASE_URL`, a URL or key=value string).
    pub database_url: String,
    /// Where to listen (`BIND`, default `127.0.0.1:3000`).
    pub bind: SocketAddr,
    /// Run the relay in this process (default); `--no-relay` serves HTTP only.
    pub relay: bool,
    /// The failure point to abort at (`CRASH_AT`), for crash tests and the demo.
    pub crash_at: Option<CrashPoint>,
    /// Serve `GET /metrics` from this recorder (installed by `main`): the write path's counters
    /// (enqueued rows, replays, mismatches, conflicts) and the in-process relay's.
    pub metrics: Option<txoutbox_axum::prometheus::PrometheusHandle>,
    /// The operator dashboard's users (`DASHBOARD_USERS`, comma-separated NAME:PASSWORD:ROLE):
    /// with any, the dashboard is mounted under `/outbox`; without, it is not served.
    pub dashboard_users: Vec<txoutbox_dashboard::User>,
    /// The shipping chain (`SHIPPING_URL` and `SHIPPING_WEBHOOK_SECRET`): a succeeded charge's
    /// `charge.succeeded` webhook goes there. Without it, no webhook is enqueued.
    pub shipping: Option<Shipping>,
}

/// Where a succeeded charge's `charge.succeeded` webhook goes.
#[derive(Debug, Clone)]
pub struct Shipping {
    /// The shipping service's webhook endpoint (`SHIPPING_URL`,
    /// `http://127.0.0.1:3001/webhooks` for a shipping service on its default address).
    pub url: String,
    /// The `whsec_` secret the webhook is signed with (`SHIPPING_WEBHOOK_SECRET`), the one the
    /// shipping service's `WEBHOOK_SECRET` names.
    pub secret: String,
}

impl Shipping {
    /// `SHIPPING_URL` and `SHIPPING_WEBHOOK_SECRET`: `None` without a URL; an error with a URL
    /// and no secret.
    pub fn from_env() -> anyhow::Result<Option<Self>> {
        let var = |name| {
            std::env::var(name)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        let Some(url) = var("SHIPPING_URL") else {
            return Ok(None);
        };
        let secret = var("SHIPPING_WEBHOOK_SECRET")
            .context("SHIPPING_URL is set: SHIPPING_WEBHOOK_SECRET (whsec_…) must be too")?;
        Ok(Some(Self { url, secret }))
    }
}

impl Settings {
    /// `DATABASE_URL` (required), `BIND`, `CRASH_AT`, `DASHBOARD_USERS`, `SHIPPING_URL` and
    /// `SHIPPING_WEBHOOK_SECRET`; the relay on. Stripe and mail settings are
    /// read by their sinks when the relay starts.
    pub fn from_env() -> anyhow::Result<Self> {
        let database_url = std::env::var("DATABASE_URL").context("DATABASE_URL is not set")?;
        let bind = std::env::var("BIND")
            .ok()
            .filter(|b| !b.trim().is_empty())
            .unwrap_or_else(|| "127.0.0.1:3000".into());
        let crash_at = match std::env::var("CRASH_AT").ok().filter(|c| !c.is_empty()) {
            Some(point) => Some(point.parse()?),
            None => None,
        };
        let dashboard_users = std::env::var("DASHBOARD_USERS")
            .unwrap_or_default()
            .split(',')
            .filter(|u| !u.trim().is_empty())
            .map(|u| txoutbox_dashboard::User::parse(u.trim()))
            .collect::<Result<_, _>>()
            .context("DASHBOARD_USERS")?;
        Ok(Self {
            database_url,
            bind: bind.parse().with_context(|| format!("BIND={bind}"))?,
            relay: true,
            crash_at,
            metrics: None,
            dashboard_users,
            shipping: Shipping::from_env()?,
        })
    }
}

/// Applies txoutbox's migrations, then the service's own, each under an advisory lock so that
/// instances starting at once apply them once.
pub async fn migrate(pg: &txoutbox::pg::PgConfig) -> anyhow::Result<()> {
    let runner = embedded::migrations::runner();
    example_support::migrate(pg, runner, HISTORY_TABLE, MIGRATION_LOCK, "charge-service").await
}

pub use example_support::{pool, RELAY_LEASE};

/// The longest one Stripe call or one SMTP delivery may take. Well below [`RELAY_LEASE`]: a call
/// still running when its lease ends is claimed and made again by the next relay (a slow SMTP
/// server would get the receipt once per lease), and the relay refuses a sink whose timeout is
/// not below the lease.
pub const SINK_TIMEOUT: Duration = Duration::from_secs(5);

/// The email sink from the environment (`SMTP_URL` and its `SMTP_HELO_NAME`, else `MAIL_DIR`),
/// bounded by [`SINK_TIMEOUT`] (the sink's own default, 20 s, is longer than this relay's lease).
fn email_sink() -> anyhow::Result<txoutbox_email::EmailSink> {
    Ok(txoutbox_email::EmailSink::from_env_with(
        txoutbox_email::SmtpConfig {
            timeout: SINK_TIMEOUT,
            ..txoutbox_email::SmtpConfig::default()
        },
    )?)
}

/// The relay with the Stripe and email sinks (from the environment) and the charge hook; with
/// `shipping`, also the shipping service's webhook sink, and the hook enqueues its webhooks.
pub fn relay(
    pg: &txoutbox::pg::PgConfig,
    shipping: Option<&Shipping>,
) -> anyhow::Result<txoutbox::relay::Relay> {
    let stripe = txoutbox_stripe::StripeSink::from_env()
        .context("the relay's Stripe sink (STRIPE_SECRET_KEY, STRIPE_API_BASE)")?
        .with_timeout(SINK_TIMEOUT);
    let email = email_sink().context("the relay's email sink")?;
    let mut builder = txoutbox::relay::Relay::builder(pg.clone())
        .config(example_support::relay_config())
        .sink(txoutbox_stripe::DESTINATION, stripe)
        .sink(txoutbox_email::DESTINATION, email);
    let mut hook = ChargeHook::default();
    if let Some(shipping) = shipping {
        let secret = txoutbox::standard_webhooks::WebhookSecret::parse(&shipping.secret)
            .context("SHIPPING_WEBHOOK_SECRET")?;
        let config = txoutbox_webhook::WebhookConfig {
            timeout: SINK_TIMEOUT,
            ..txoutbox_webhook::WebhookConfig::default()
        };
        let sink = txoutbox_webhook::WebhookSink::with_config(&shipping.url, secret, config)
            .context("SHIPPING_URL")?;
        builder = builder.sink(SHIPPING_DESTINATION, sink);
        hook = hook.with_shipping();
    }
    Ok(builder.hook(txoutbox_stripe::DESTINATION, hook).build()?)
}

/// The operator dashboard for this service's outbox, for `users`: the customer's email is never
/// shown, and `/keys` finds a charge request's PaymentIntent and receipt by their effect names.
pub fn dashboard(
    pool: deadpool_postgres::Pool,
    users: Vec<txoutbox_dashboard::User>,
) -> axum::Router {
    txoutbox_dashboard::router(
        pool,
        txoutbox_dashboard::DashboardConfig {
            users,
            redact: vec!["email".into()],
            effects: vec!["payment_intent".into(), "receipt".into()],
            // The in-process relay's sinks: pausable before their first row.
            destinations: vec![
                txoutbox_stripe::DESTINATION.into(),
                txoutbox_email::DESTINATION.into(),
            ],
            ..txoutbox_dashboard::DashboardConfig::default()
        },
    )
}

/// Migrates, then serves HTTP (and runs the relay unless `settings.relay` is off) until
/// `shutdown` resolves.
pub async fn serve(settings: Settings, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let pg = txoutbox::pg::PgConfig::parse(&settings.database_url).context("DATABASE_URL")?;
    migrate(&pg).await?;
    let pool = pool(&pg, 32)?;
    let relay = if settings.relay {
        Some(relay(&pg, settings.shipping.as_ref())?)
    } else {
        None
    };
    let app = App::new(pool.clone(), settings.crash_at)?;
    let mut routes = router(app);
    if !settings.dashboard_users.is_empty() {
        routes = routes.nest("/outbox", dashboard(pool.clone(), settings.dashboard_users));
    }
    if let Some(handle) = settings.metrics {
        routes = routes.route("/metrics", txoutbox_axum::prometheus::route(handle));
    }
    example_support::serve(settings.bind, "charge-service", routes, relay, shutdown).await
}
