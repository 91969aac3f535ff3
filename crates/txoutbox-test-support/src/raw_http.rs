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
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

/// The server's send buffer, in bytes (the kernel doubles it).
const SEND_BUFFER: u32 = 16 * 1024;

/// What the server does once it has read a whole request (head and `Content-Length` body).
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Writes these bytes (see [`response`]) and closes the connection.
    Answer(Vec<u8>),
    /// Writes `head` (a status line and headers, ending in a blank line), then `chunk` again and
    /// again until the client goes away: a body without end. How much of it the server wrote
    /// before the client left is [`RawHttpServer::body_written_until_the_client_left`].
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
    /// The body bytes of [`Behaviour::Endless`] written to a connection whose client has left.
    left: watch::Receiver<Option<u64>>,
    task: tokio::task::JoinHandle<()>,
}

/// What one connection shares with the server.
#[derive(Clone)]
struct Tally {
    requests: Arc<AtomicUsize>,
    left: Arc<watch::Sender<Option<u64>>>,
}

impl RawHttpServer {
    /// Listens on a free port of 127.0.0.1, behaving as `behaviour` to every request.
    pub async fn start(behaviour: Behaviour) -> Result<Self> {
        let socket = TcpSocket::new_v4()?;
        // Accepted connections inherit it: a small send buffer that does not grow keeps what
        // the server counts as written close to what the client took.
        socket.set_send_buffer_size(SEND_BUFFER)?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let listener = socket.listen(64)?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicUsize::new(0));
        let (left_tx, left) = watch::channel(None);
        let tally = Tally {
            requests: requests.clone(),
            left: Arc::new(left_tx),
        };
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                connections.spawn(serve(socket, behaviour.clone(), tally.clone()));
            }
        });
        Ok(Self {
            addr,
            requests,
            left,
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

    /// For [`Behaviour::Endless`]: waits until a client has gone away (its connection refused
    /// the next write) and returns how many body bytes the server wrote to it before. A client
    /// can read no more than that, so a count below the `Content-Length` announced proves the
    /// client left before the body's end. It is more than the client read: the two sockets'
    /// buffers hold the rest. Never returns while no client leaves: wrap it in a timeout.
    pub async fn body_written_until_the_client_left(&self) -> Result<u64> {
        let mut left = self.left.clone();
        let written = left.wait_for(Option::is_some).await?;
        Ok(written.unwrap_or_default())
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

async fn serve(mut socket: TcpStream, behaviour: Behaviour, tally: Tally) {
    if read_request(&mut socket).await.is_err() {
        return;
    }
    tally.requests.fetch_add(1, Ordering::SeqCst);
    match behaviour {
        Behaviour::Answer(bytes) => {
            let _ = socket.write_all(&bytes).await;
            let _ = socket.shutdown().await;
        }
        Behaviour::Endless { head, chunk } => {
            if socket.write_all(&head).await.is_err() {
                return;
            }
            let mut written = 0u64;
            // `write`, not `write_all`: the bytes of a chunk the client took before it left count.
            while let Ok(n @ 1..) = socket.write(&chunk).await {
                written += n as u64;
            }
            tally.left.send_replace(Some(written));
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
