//! The scripted downstream: a loopback HTTP/1.1 server, written on raw TCP so it can misbehave
//! (reset, hang, drop after accepting), that answers each row's calls from the plan and records
//! every call: the row, its `webhook-id`, when it arrived and ended, what it answered, and whether
//! the effect happened (a 2xx that was written, or a request accepted before the drop).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::plan::{Answer, Body, RetryAfter, RowPlan};

/// One call the downstream received.
#[derive(Debug, Clone)]
pub struct Call {
    /// The row (from the body's `data.row`).
    pub row: usize,
    /// The `webhook-id` header (the row's downstream key).
    pub webhook_id: String,
    /// When the request had fully arrived, from the start of the run.
    pub start: Duration,
    /// When the call ended (answer written, or connection closed), from the start of the run.
    pub end: Option<Duration>,
    /// What the downstream did.
    pub answer: &'static str,
    /// The effect happened (an at-most-once receiver did the thing).
    pub applied: bool,
}

struct State {
    epoch: Instant,
    lease: Duration,
    rows: HashMap<usize, RowPlan>,
    calls: Mutex<Vec<Call>>,
    /// Calls per row that were answered from the script (storm answers do not count).
    scripted: Mutex<HashMap<usize, usize>>,
    storm_until: Mutex<Option<Instant>>,
    faults: Mutex<BTreeMap<&'static str, u64>>,
    strays: AtomicU64,
}

/// The running downstream.
#[derive(Clone)]
pub struct Downstream {
    state: Arc<State>,
    port: u16,
}

impl Downstream {
    /// Listens on a loopback port and serves until the process ends.
    pub async fn start(epoch: Instant, lease: Duration, rows: &[RowPlan]) -> Result<Downstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(State {
            epoch,
            lease,
            rows: rows.iter().map(|r| (r.index, r.clone())).collect(),
            calls: Mutex::default(),
            scripted: Mutex::default(),
            storm_until: Mutex::default(),
            faults: Mutex::default(),
            strays: AtomicU64::new(0),
        });
        let serving = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let state = serving.clone();
                tokio::spawn(async move { serve(state, stream).await });
            }
        });
        Ok(Downstream { state, port })
    }

    /// The URL of a destination's endpoint.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// Every call 429s until `length` has passed.
    pub fn storm(&self, length: Duration) {
        if let Ok(mut until) = self.state.storm_until.lock() {
            *until = Some(Instant::now() + length);
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state
            .calls
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// Faults injected so far, by kind.
    pub fn faults(&self) -> BTreeMap<&'static str, u64> {
        self.state
            .faults
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default()
    }

    /// Requests that named no row of the plan.
    pub fn strays(&self) -> u64 {
        self.state.strays.load(Ordering::Relaxed)
    }

    /// True when the row's effect happened at least once.
    pub fn applied(&self, row: usize) -> bool {
        self.state
            .calls
            .lock()
            .map(|c| c.iter().any(|c| c.row == row && c.applied))
            .unwrap_or(false)
    }
}

impl State {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn count(&self, fault: &'static str) {
        if let Ok(mut f) = self.faults.lock() {
            *f.entry(fault).or_default() += 1;
        }
    }

    /// Records a call's arrival; returns its index in the log and the answer to give.
    fn begin(&self, row: &RowPlan, webhook_id: String) -> (usize, Answer) {
        let storming = self
            .storm_until
            .lock()
            .map(|u| u.is_some_and(|u| Instant::now() < u))
            .unwrap_or(false);
        let answer = if storming {
            self.count("429 storm answer");
            Answer::RetryAfter(RetryAfter::Small, 429)
        } else {
            let n = self
                .scripted
                .lock()
                .map(|mut s| {
                    let n = s.entry(row.index).or_default();
                    *n += 1;
                    *n - 1
                })
                .unwrap_or(0);
            let answer = row.answer(n);
            if let Some(fault) = answer.fault() {
                self.count(fault);
            }
            answer
        };
        let call = Call {
            row: row.index,
            webhook_id,
            start: self.now(),
            end: None,
            answer: "",
            applied: false,
        };
        let index = self
            .calls
            .lock()
            .map(|mut c| {
                c.push(call);
                c.len() - 1
            })
            .unwrap_or(usize::MAX);
        (index, answer)
    }

    fn end(&self, index: usize, answer: &'static str, applied: bool) {
        let now = self.now();
        if let Ok(mut calls) = self.calls.lock() {
            if let Some(call) = calls.get_mut(index) {
                call.end = Some(now);
                call.answer = answer;
                call.applied = applied;
            }
        }
    }
}

/// One connection: one request, one (mis)behaviour, then the connection is closed.
async fn serve(state: Arc<State>, mut stream: TcpStream) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    // The body names the row; a body no JSON parser reads (a payload stored undecodable, sent
    // as it is) is named by the soak's own downstream key, `soak-<row>`.
    let row = serde_json::from_slice::<serde_json::Value>(&request.body)
        .ok()
        .and_then(|v| v.pointer("/data/row").and_then(|r| r.as_u64()))
        .or_else(|| request.webhook_id.strip_prefix("soak-")?.parse().ok())
        .and_then(|r| state.rows.get(&(r as usize)));
    let Some(row) = row else {
        state.strays.fetch_add(1, Ordering::Relaxed);
        let _ = respond(&mut stream, 400, "Bad Request", &[], b"no such row").await;
        return;
    };
    let (index, answer) = state.begin(row, request.webhook_id);
    // Bounded: a caller that stops reading a huge body cannot hold the call open forever.
    let (label, applied) =
        tokio::time::timeout(Duration::from_secs(90), act(&state, &mut stream, answer))
            .await
            .unwrap_or(("gave up writing after 90 s", false));
    state.end(index, label, applied);
}

/// Does what the answer says; returns its label and whether the effect happened.
async fn act(state: &State, stream: &mut TcpStream, answer: Answer) -> (&'static str, bool) {
    match answer {
        Answer::Ok => ok(stream).await,
        Answer::Slow(ms) => {
            if wait_or_hang_up(stream, Duration::from_millis(ms)).await {
                return ("caller hung up during a slow answer", false);
            }
            ok(stream).await
        }
        Answer::SlowerThanLease => {
            if wait_or_hang_up(stream, state.lease + Duration::from_secs(1)).await {
                return (
                    "caller hung up before the answer (slower than the lease)",
                    false,
                );
            }
            ok(stream).await
        }
        Answer::Hang => {
            if wait_or_hang_up(stream, Duration::from_secs(60)).await {
                ("hang: caller hung up", false)
            } else {
                ("hang: closed after 60 s", false)
            }
        }
        Answer::ServerError(body) => {
            let bytes: Vec<u8> = match body {
                Body::Nul => b"internal error\0\0 at \0frame 3".to_vec(),
                Body::Binary => (0..600u32)
                    .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                    .collect(),
                Body::Huge => vec![b'x'; 4 << 20],
                Body::Text => b"internal error".to_vec(),
            };
            let _ = respond(stream, 500, "Internal Server Error", &[], &bytes).await;
            ("500", false)
        }
        Answer::RetryAfter(kind, status) => {
            let value = match kind {
                RetryAfter::Huge => "10000000000000",
                RetryAfter::Negative => "-5",
                RetryAfter::Garbage => "soon, maybe",
                RetryAfter::Small => "1",
            };
            let reason = if status == 429 {
                "Too Many Requests"
            } else {
                "Service Unavailable"
            };
            let _ = respond(
                stream,
                status,
                reason,
                &[("retry-after", value)],
                b"slow down",
            )
            .await;
            (if status == 429 { "429" } else { "503" }, false)
        }
        Answer::Reset => {
            let _ = stream.set_zero_linger();
            ("reset", false)
        }
        Answer::AcceptedThenDropped => {
            let _ = stream.shutdown().await;
            ("accepted, then dropped", true)
        }
        Answer::Poison => {
            let _ = respond(stream, 422, "Unprocessable Entity", &[], b"poisoned row").await;
            ("422", false)
        }
    }
}

async fn ok(stream: &mut TcpStream) -> (&'static str, bool) {
    match respond(stream, 200, "OK", &[], b"{\"ok\":true}").await {
        Ok(()) => ("200", true),
        Err(_) => ("200 not written: caller gone", false),
    }
}

/// Waits `d`, watching the connection; true when the caller hung up first.
async fn wait_or_hang_up(stream: &mut TcpStream, d: Duration) -> bool {
    let mut byte = [0u8; 64];
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return false,
            read = stream.read(&mut byte) => match read {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            },
        }
    }
}

struct Request {
    webhook_id: String,
    body: Vec<u8>,
}

/// Reads one request (head and a `content-length` body); `None` on anything malformed.
/// Appends what the peer sends next to `buf`, waiting 30 s at most: `None` once it has closed
/// the connection, or on an error or a timeout.
async fn read_some(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
        .await
        .ok()?
        .ok()?;
    if n == 0 {
        return None;
    }
    buf.extend_from_slice(&chunk[..n]);
    Some(())
}

async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > 64 << 10 {
            return None;
        }
        read_some(stream, &mut buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length")?.parse().ok()?;
    if length > 1 << 20 {
        return None;
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        read_some(stream, &mut body).await?;
    }
    body.truncate(length);
    Some(Request {
        webhook_id: header("webhook-id").unwrap_or_default(),
        body,
    })
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    reason: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await?;
    stream.shutdown().await
}
