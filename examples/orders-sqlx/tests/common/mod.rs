//! Shared arrangements: a test database as sqlx reads it, the service in this process or as a
//! child process, and requests to it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use txoutbox_test_support::process::service_command;
use txoutbox_test_support::{test_db, ConnInfo, LoopbackServer, TestDb};

/// `DATABASE_URL` for sqlx: a `postgres://` URL (sqlx reads no key=value string), a socket
/// directory as its `host` parameter.
pub fn sqlx_url(db: &ConnInfo) -> anyhow::Result<String> {
    let mut url = url::Url::parse("postgres://localhost")?;
    if db.host().starts_with('/') {
        url.query_pairs_mut().append_pair("host", db.host());
    } else {
        url.set_host(Some(db.host()))?;
    }
    url.set_port(Some(db.port()))
        .map_err(|()| anyhow::anyhow!("no port in {url}"))?;
    url.set_username(db.user())
        .map_err(|()| anyhow::anyhow!("no user in {url}"))?;
    url.set_password(db.password())
        .map_err(|()| anyhow::anyhow!("no password in {url}"))?;
    url.set_path(db.dbname());
    Ok(url.into())
}

/// An HTTP client (plain HTTP; the crypto provider is installed for reqwest's sake).
pub use txoutbox_test_support::http_client as http;

/// The body of an order the service accepts.
pub fn order() -> Value {
    json!({"customer_id": "cus_1", "amount": 1200, "email": "a@example.com"})
}

/// A fresh key.
pub fn key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Where the service answers, and how to send it an order.
#[derive(Clone)]
pub struct Orders {
    pub base: String,
    pub http: reqwest::Client,
}

impl Orders {
    /// `POST /orders` of `body` (bytes as given) under `key`.
    pub async fn post_raw(&self, key: &str, body: Vec<u8>) -> anyhow::Result<reqwest::Response> {
        Ok(self
            .http
            .post(format!("{}/orders", self.base))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await?)
    }

    /// `POST /orders` of `body` under `key`.
    pub async fn post(&self, key: &str, body: &Value) -> anyhow::Result<reqwest::Response> {
        self.post_raw(key, serde_json::to_vec(body)?).await
    }

    /// `GET /orders/{id}`.
    pub async fn get(&self, id: &str) -> anyhow::Result<reqwest::Response> {
        Ok(self
            .http
            .get(format!("{}/orders/{id}", self.base))
            .send()
            .await?)
    }
}

/// The service in this process, on a database of its own; the server stops when dropped.
pub struct LocalService {
    // Declared first, so dropped (stopped) before the database.
    _server: LoopbackServer,
    pub orders: Orders,
    pub db: TestDb,
    pub client: tokio_postgres::Client,
}

impl LocalService {
    /// Migrates a test database as the service does at start and serves its router.
    pub async fn start() -> anyhow::Result<Self> {
        let db = test_db().await?;
        let pool = orders_sqlx::pool(&sqlx_url(db.info())?, 16)?;
        orders_sqlx::migrate(&pool).await?;
        let app = orders_sqlx::App::new(pool, false)?;
        let server = LoopbackServer::start(orders_sqlx::router(app)).await?;
        Ok(Self {
            orders: Orders {
                base: format!("http://{}", server.addr),
                http: http()?,
            },
            client: db.connect().await?,
            db,
            _server: server,
        })
    }
}

/// The `orders-sqlx` binary as a child process; killed when dropped.
pub struct ServiceProcess {
    child: tokio::process::Child,
    pub orders: Orders,
}

impl ServiceProcess {
    /// Starts the binary on a free port with `env` and waits for its "listening on" line (at
    /// most 60 s: it migrates first).
    pub async fn start(env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let exe = env!("CARGO_BIN_EXE_orders-sqlx");
        let mut child = service_command(exe, "127.0.0.1:0", env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting orders-sqlx")?;
        let stdout = child.stdout.take().context("the child's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("orders-sqlx did not listen within 60 s")??;
        let Some(addr) = line
            .as_deref()
            .and_then(|l| l.strip_prefix("listening on http://"))
        else {
            let status = child.wait().await?;
            bail!("orders-sqlx exited at start ({status}) after printing {line:?}");
        };
        let addr: SocketAddr = addr.parse()?;
        Ok(Self {
            child,
            orders: Orders {
                base: format!("http://{addr}"),
                http: http()?,
            },
        })
    }

    /// The process's id, for signals.
    pub fn id(&self) -> anyhow::Result<u32> {
        self.child.id().context("the process has exited")
    }

    /// Waits for the process to end by itself, at most `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .context("orders-sqlx did not exit")?
            .context("waiting for orders-sqlx")
    }
}
