//! HTTP on loopback for tests: a server of the test's own ([`serve_on_loopback`]), a client
//! ([`http_client`]) and requests written by hand ([`request_text`], [`rebound_pause`]).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;

/// A `reqwest` client giving up after 30 s (plain HTTP; the crypto provider is installed for
/// reqwest's sake: its rustls has none bundled).
pub fn http_client() -> Result<reqwest::Client> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?)
}

/// Serves `router` on a free loopback port until the test ends (or the handle is aborted): its
/// address and its task.
pub async fn serve_on_loopback(
    router: axum::Router,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((addr, task))
}

/// A router served on a free loopback port, stopped when this is dropped: what a test's own
/// server (a receiver, a service in process) holds instead of a task and a `Drop` of its own.
#[derive(Debug)]
pub struct LoopbackServer {
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl LoopbackServer {
    /// Serves `router` (as [`serve_on_loopback`]) until this is dropped.
    pub async fn start(router: axum::Router) -> Result<Self> {
        let (addr, task) = serve_on_loopback(router).await?;
        Ok(Self { addr, task })
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The text of an HTTP/1.1 request, `Connection: close`, with `headers` and a `Content-Length`
/// for `body`: what a test sends over a plain TCP stream to choose every header, `Host`
/// included.
pub fn request_text(
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    request
}

/// What a DNS-rebinding page sends from a visitor's browser to a dashboard mounted at `mount`:
/// a pause of `email`, with the page's own `host` (and the dashboard's port) as the Host and the
/// Origin, same-origin by the browser's reckoning.
pub fn rebound_pause(mount: &str, host: &str) -> String {
    let origin = format!("http://{host}");
    request_text(
        "POST",
        &format!("{mount}/api/destinations/email/pause"),
        host,
        &[
            ("Content-Type", "application/json"),
            ("Origin", &origin),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        r#"{"reason":"rebinding"}"#,
    )
}

/// `POST url` of the JSON `body`, with `key` as its `Idempotency-Key` when there is one.
pub async fn post_json_with_key(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &serde_json::Value,
) -> Result<reqwest::Response> {
    let mut request = http.post(url).json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    Ok(request.send().await?)
}
