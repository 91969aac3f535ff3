//! `txoutbox dashboard`: serves the operator dashboard (`txoutbox-dashboard`) until SIGINT or
//! SIGTERM. Thin: reads the flags, builds the pool, calls the crate.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use txoutbox_dashboard::{DashboardConfig, User};

/// Flags of `txoutbox dashboard`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    txoutbox dashboard                                  # http://127.0.0.1:9470, no sign-in, loopback only\n  \
    txoutbox dashboard --addr 0.0.0.0:9470 --user alice:s3cret:operator --user bob:sha256:<hex>:viewer\n  \
    txoutbox dashboard --redact email,card --trace-url 'https://tempo.example/trace/{trace_id}'")]
pub struct DashboardArgs {
    /// Where to listen. Without --user, only a loopback address is used (the port is kept), and
    /// only requests addressed to localhost, 127.0.0.1 or [::1] (or an --allowed-host) are
    /// answered.
    #[arg(long, env = "TXOUTBOX_DASHBOARD_ADDR", default_value = txoutbox_dashboard::DEFAULT_ADDR)]
    addr: SocketAddr,
    /// A user, NAME:PASSWORD:ROLE (role viewer or operator; PASSWORD may be sha256:<hex> of the
    /// password). Repeatable; comma-separated in the environment variable.
    #[arg(long = "user", env = "TXOUTBOX_DASHBOARD_USERS", value_delimiter = ',', hide_env_values = true, value_parser = parse_user)]
    users: Vec<User>,
    /// Without --user, a Host name answered besides localhost, 127.0.0.1 and [::1] (NAME for
    /// any port, NAME:PORT for one), for a dashboard behind a proxy that forwards its own Host
    /// and signs users in itself. Repeatable; comma-separated in the environment variable.
    #[arg(
        long = "allowed-host",
        env = "TXOUTBOX_DASHBOARD_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
    /// Fields never shown (at any depth of payloads, headers and stored responses; a document
    /// that cannot be redacted is withheld), comma-separated: --redact email,card.
    #[arg(long, env = "TXOUTBOX_DASHBOARD_REDACT", value_delimiter = ',')]
    redact: Vec<String>,
    /// A link for trace ids; {trace_id} is replaced.
    #[arg(long, env = "TXOUTBOX_DASHBOARD_TRACE_URL")]
    trace_url: Option<String>,
    /// Effect names the services enqueue under, comma-separated: /keys finds a request's
    /// messages by the keys derived for them.
    #[arg(long = "effect", value_delimiter = ',')]
    effects: Vec<String>,
    /// Database connections of the dashboard.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pool_size: u16,
}

fn parse_user(spec: &str) -> Result<User, String> {
    User::parse(spec).map_err(|e| e.to_string())
}

/// Serves the dashboard until SIGINT or SIGTERM.
pub async fn run(url: &str, args: DashboardArgs) -> Result<()> {
    let pg = txoutbox::pg::PgConfig::parse(url).context("DATABASE_URL")?;
    let pool = pg
        .pool_builder(usize::from(args.pool_size))
        .build()
        .context("cannot build the connection pool")?;
    let (addr, notice) = txoutbox_dashboard::listen_addr(args.addr, !args.users.is_empty());
    if let Some(notice) = notice {
        eprintln!("warning: {notice}");
    }
    warn_on_schema(&pool).await;
    let router = txoutbox_dashboard::router(
        pool,
        DashboardConfig {
            users: args.users,
            allowed_hosts: args.allowed_hosts,
            redact: args.redact,
            trace_url: args.trace_url,
            effects: args.effects,
            ..DashboardConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    println!("dashboard on http://{}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(
            txoutbox::relay::Shutdown::on_signal()
                .context("installing the SIGINT and SIGTERM handlers")?
                .wait(),
        )
        .await
        .context("the dashboard server failed")
}

/// Says at start when the database's schema is not the version this build reads: the dashboard
/// serves anyway, its pages answering 503 with the same line until `txoutbox migrate` has run.
/// A database that does not answer within a moment is the pages' to report.
async fn warn_on_schema(pool: &deadpool_postgres::Pool) {
    let checked = tokio::time::timeout(Duration::from_secs(2), async {
        let client = pool.get().await.map_err(txoutbox::Error::from)?;
        txoutbox::check_schema(&client).await
    })
    .await;
    if let Ok(Err(txoutbox::Error::Schema(mismatch))) = checked {
        eprintln!("warning: {mismatch} (until then, every page answers 503 with this line)");
    }
}
