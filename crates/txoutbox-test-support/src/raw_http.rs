//! A hostile HTTP/1.1 peer on 127.0.0.1, written on raw TCP so that it can misbehave in the ways
//! a real framework would not: answer bytes that are not text, a body that never ends, nothing
//! at all, or a dropped connection once it has read the whole request.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use txoutbox_test_support::raw_http::{response, Behaviour, RawHttpServer};
//! let server = RawHttpServer::start(Behaviour::Answer(response(500, &[], b"\0\xff"))).await?;
//! let url = server.url("/hooks");
//! # let _ = url; Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does once it has read a whole request (head and `Content-Length` body).
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Writes these bytes (see [`response`]) and closes the connection.
    Answer(Vec<u8>),
    /// Writes `head` (a status line and headers, ending in a blank line), then `chunk` again and
    /// again until the client goes away: a body without end.
    Endless {
        /// The status line and headers, `\r\n\r\n` included.
        head: Vec<u8>,
        /// Written over and over.
        chunk: Vec<u8>,
    },
    /// Never answers; keeps the connection open until the server is dropped.
    Silent,
    /// Closes the connection without writing a byte.
    Drop,
}

/// The server; stops (and closes every connection) when dropped.
pub struct RawHttpServer {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl RawHttpServer {
    /// Listens on a free port of 127.0.0.1, behaving as `behaviour` to every request.
    pub async fn start(behaviour: Behaviour) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                connections.spawn(serve(socket, behaviour.clone(), counter.clone()));
            }
        });
        Ok(Self {
            addr,
            requests,
            task,
        })
    }

    /// `http://127.0.0.1:{port}`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:{port}{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// How many whole requests the server has read: the proof that a request did arrive.
    pub fn requests_read(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for RawHttpServer {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

/// A complete HTTP/1.1 response with `Content-Length` and `Connection: close`.
pub fn response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} Status\r\n").into_bytes();
    for (name, value) in headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(body);
    out
}

/// A local port with nothing listening on it (bound, then released): connecting is refused.
pub async fn closed_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?.port())
}

async fn serve(mut socket: TcpStream, behaviour: Behaviour, requests: Arc<AtomicUsize>) {
    if read_request(&mut socket).await.is_err() {
        return;
    }
    requests.fetch_add(1, Ordering::SeqCst);
    match behaviour {
        Behaviour::Answer(bytes) => {
            let _ = socket.write_all(&bytes).await;
            let _ = socket.shutdown().await;
        }
        Behaviour::Endless { head, chunk } => {
            if socket.write_all(&head).await.is_err() {
                return;
            }
            while socket.write_all(&chunk).await.is_ok() {}
        }
        Behaviour::Silent => std::future::pending::<()>().await,
        Behaviour::Drop => drop(socket),
    }
}

/// Reads one request: the head up to the blank line, then `Content-Length` bytes of body.
async fn read_request(socket: &mut TcpStream) -> Result<()> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        anyhow::ensure!(buffer.len() < 1 << 20, "request head too large");
        let n = socket.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the client closed before a whole request");
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let n = socket.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the client closed before a whole request");
        buffer.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}
