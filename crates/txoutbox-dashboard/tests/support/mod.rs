//! A dashboard served on loopback for one test, and plain HTTP/1.1 requests to it with the
//! headers a browser (or an attacker's page) would send, `Host` included.

#![allow(dead_code)]

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use txoutbox_dashboard::DashboardConfig;
use txoutbox_test_support::LoopbackServer;
use txoutbox_test_support::{request_text, TestDb};

/// The dashboard nested under `/outbox` of a server on a loopback port; stopped when dropped.
pub struct Served {
    pub addr: SocketAddr,
    _server: LoopbackServer,
}

/// An answer: its status and its body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Served {
    /// A test database, and the dashboard of `config` serving it.
    pub async fn on_a_test_db(config: DashboardConfig) -> anyhow::Result<(TestDb, Self)> {
        let db = txoutbox_test_support::test_db().await?;
        let served = Self::start(&db, config).await?;
        Ok((db, served))
    }

    pub async fn start(db: &TestDb, config: DashboardConfig) -> anyhow::Result<Self> {
        let app =
            axum::Router::new().nest("/outbox", txoutbox_dashboard::router(db.pool(4)?, config));
        let server = LoopbackServer::start(app).await?;
        Ok(Self {
            addr: server.addr,
            _server: server,
        })
    }

    /// `method path` under `/outbox`, addressed to `host`, with `headers` and `body`.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        host: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> anyhow::Result<Answer> {
        let path = format!("/outbox{path}");
        self.send_text(&request_text(method, &path, host, headers, body))
            .await
    }

    /// Sends `request` (the text of an HTTP/1.1 request) as it is.
    pub async fn send_text(&self, request: &str) -> anyhow::Result<Answer> {
        let mut stream = tokio::net::TcpStream::connect(self.addr).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        let answer = String::from_utf8(answer)?;
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow::anyhow!("no header end: {answer:?}"))?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no status: {head:?}"))?;
        Ok(Answer {
            status,
            head: head.to_owned(),
            body: body.to_owned(),
        })
    }

    /// `GET path` addressed to the server's own address.
    pub async fn get(&self, path: &str) -> anyhow::Result<Answer> {
        self.send("GET", path, &self.addr.to_string(), &[], "")
            .await
    }

    /// `GET path` that must answer 200: the body.
    pub async fn page(&self, path: &str) -> anyhow::Result<String> {
        let answer = self.get(path).await?;
        anyhow::ensure!(answer.status == 200, "GET {path}: {answer:?}");
        Ok(answer.body)
    }

    /// `POST path` with a JSON body, from the dashboard's own pages (same origin).
    pub async fn post_json(&self, path: &str, body: &str) -> anyhow::Result<Answer> {
        let host = self.addr.to_string();
        let origin = format!("http://{host}");
        self.send(
            "POST",
            path,
            &host,
            &[
                ("Content-Type", "application/json"),
                ("Origin", &origin),
                ("Sec-Fetch-Site", "same-origin"),
            ],
            body,
        )
        .await
    }
}
