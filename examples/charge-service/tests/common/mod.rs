//! Shared arrangements: a migrated database with the service's tables, an in-process server.
#![allow(dead_code)]

use std::time::Duration;

use charge_service::{App, CrashPoint};
use txoutbox_client::{IdempotentClient, RetryPolicy};
use txoutbox_test_support::fake_stripe::FakeStripe;
use txoutbox_test_support::smtp::SmtpServer;
use txoutbox_test_support::{test_db, LoopbackServer, TestDb};

/// A server on 127.0.0.1:0 in this process (HTTP only; no relay).
pub struct LocalServer {
    pub base: String,
    pub pool: deadpool_postgres::Pool,
    _server: LoopbackServer,
}

pub async fn local_server(pg: &txoutbox::pg::PgConfig) -> anyhow::Result<LocalServer> {
    charge_service::migrate(pg).await?;
    let pool = charge_service::pool(pg, 32)?;
    let app = App::new(pool.clone(), None::<CrashPoint>)?;
    let server = LoopbackServer::start(charge_service::router(app)).await?;
    Ok(LocalServer {
        base: format!("http://{}", server.addr),
        pool,
        _server: server,
    })
}

pub async fn db_and_server() -> anyhow::Result<(TestDb, LocalServer)> {
    let db = test_db().await?;
    let server = local_server(&db.config()?).await?;
    Ok((db, server))
}

pub fn client(deadline: Duration, attempt_timeout: Duration) -> anyhow::Result<IdempotentClient> {
    Ok(IdempotentClient::new(RetryPolicy {
        deadline,
        attempt_timeout,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(300),
        max_attempts: 200,
    })?)
}

pub fn charge_body(customer: &str) -> serde_json::Value {
    serde_json::json!({
        "customer_id": customer,
        "amount": 1500,
        "currency": "eur",
        "email": "ada@example.org",
    })
}

pub async fn count(pool: &deadpool_postgres::Pool, sql: &str) -> anyhow::Result<i64> {
    Ok(pool.get().await?.query_one(sql, &[]).await?.get(0))
}

/// What the service binary talks to: its own database, the fake Stripe API, a real SMTP server.
pub struct Peers {
    pub db: TestDb,
    pub stripe: FakeStripe,
    pub smtp: SmtpServer,
}

impl Peers {
    pub async fn start() -> anyhow::Result<Self> {
        Ok(Self {
            db: test_db().await?,
            stripe: FakeStripe::start().await?,
            smtp: SmtpServer::start().await?,
        })
    }

    /// The service's environment for these peers.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("DATABASE_URL".to_owned(), self.db.url()),
            (
                "STRIPE_SECRET_KEY".to_owned(),
                self.stripe.secret_key().to_owned(),
            ),
            ("STRIPE_API_BASE".to_owned(), self.stripe.base_url()),
            ("SMTP_URL".to_owned(), self.smtp.url()),
        ]
    }
}

/// The service binary on a free address with `env`, started.
pub async fn start_service(
    env: &[(String, String)],
) -> anyhow::Result<charge_service::ServiceProcess> {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_charge-service"));
    charge_service::ServiceProcess::start(exe, charge_service::free_addr()?, env, &[]).await
}

/// `POST /charge` of `customer` to `server` with a patient client (30 s, 5 s an attempt); the
/// answer must be a 201.
pub async fn charge(
    server: &charge_service::ServiceProcess,
    customer: &str,
) -> anyhow::Result<txoutbox_client::Outcome> {
    let outcome = client(Duration::from_secs(30), Duration::from_secs(5))?
        .operation()
        .post_json(
            &format!("{}/charge", server.base_url()),
            &charge_body(customer),
        )
        .await?;
    assert_eq!(outcome.status, 201);
    Ok(outcome)
}

/// Fails unless `outcome` is a 201, showing its body.
pub fn assert_created(outcome: &txoutbox_client::Outcome) {
    assert_eq!(
        outcome.status,
        201,
        "{}",
        String::from_utf8_lossy(&outcome.body)
    );
}
