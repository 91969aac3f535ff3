//! Programs under test as processes: owning one ([`OwnedChild`]: killed when dropped), stopping one the way an operator or a supervisor does
//! ([`terminate`]: SIGTERM, then its exit code), and reading its HTTP endpoints ([`http_get`],
//! [`wait_for_get`]: a plain HTTP/1.1 GET, polled until its answer says what the test waits for),
//! and what it prints ([`first_stdout_line`], [`stdout_lines`], [`succeeded`], [`one_error_line`]).
//! [`service_command`] is the command that starts an example service as a child.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Output};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::WAIT_LIMIT;

/// The command that starts the service binary `exe` listening on `bind` (its `BIND`), in this
/// process's environment less `CRASH_AT` (a crash point is the caller's to give in `env`) with
/// `env` set over it, no stdin, and killed when dropped. The caller says what becomes of its
/// stdout.
pub fn service_command<K: AsRef<OsStr>, V: AsRef<OsStr>>(
    exe: impl AsRef<OsStr>,
    bind: &str,
    env: impl IntoIterator<Item = (K, V)>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(exe);
    command
        .env("BIND", bind)
        .env_remove("CRASH_AT")
        .envs(env)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    command
}

/// Sends SIGTERM to `child` and waits (at most 20 s) for its exit code; kills it and fails when
/// it does not stop.
pub fn terminate(child: &mut Child) -> Result<Option<i32>> {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -TERM failed");
    let start = Instant::now();
    loop {
        if let Some(exit) = child.try_wait()? {
            return Ok(exit.code());
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("the process did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A plain HTTP/1.1 `GET path` to `addr` (10 s at most): the status and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange).await??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no header end in {response:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Polls [`http_get`] every 50 ms until `done(status, body)` holds (a refused connection counts
/// as not yet), and returns that answer; fails naming the last answer when [`WAIT_LIMIT`]
/// passes first.
pub async fn wait_for_get(
    addr: SocketAddr,
    path: &str,
    done: impl Fn(u16, &str) -> bool,
) -> Result<(u16, String)> {
    let start = Instant::now();
    let mut last = None;
    loop {
        match http_get(addr, path).await {
            Ok((status, body)) if done(status, &body) => return Ok((status, body)),
            Ok(answer) => last = Some(answer),
            Err(_) => {}
        }
        anyhow::ensure!(
            start.elapsed() < WAIT_LIMIT,
            "GET {path} never satisfied the condition; last answer: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until something accepts connections on `addr` (a server just started); fails when
/// [`WAIT_LIMIT`] passes first.
pub async fn wait_for_listener(addr: SocketAddr) -> Result<()> {
    let start = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        anyhow::ensure!(
            start.elapsed() < WAIT_LIMIT,
            "nothing listens on {addr} after {WAIT_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The first line `child` writes to its piped stdout (what a server prints when it listens),
/// without its line end.
pub fn first_stdout_line(child: &mut Child) -> Result<String> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    Ok(line.trim_end().to_owned())
}

/// Every line `child` writes to its piped stdout, as it comes (read on a thread of its own, so
/// a test waits on the channel with a limit of its choosing).
pub fn stdout_lines(child: &mut Child) -> Result<mpsc::Receiver<String>> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    Ok(lines)
}

/// The stdout of a command that must have succeeded; the test fails showing its stderr when it
/// did not.
pub fn succeeded(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The stderr of a command that failed as a runtime error does: exit code 1 and one line.
pub fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

/// A child process the test owns: killed and reaped when dropped, so a failing test leaves no
/// process behind. Derefs to the [`Child`].
#[derive(Debug)]
pub struct OwnedChild(pub Child);

impl Drop for OwnedChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl From<Child> for OwnedChild {
    fn from(child: Child) -> Self {
        Self(child)
    }
}

impl std::ops::Deref for OwnedChild {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for OwnedChild {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// Runs `command` (`what` names it in errors) and fails with what it printed unless it succeeds;
/// its output.
pub(crate) fn run_checked(command: &mut Command, what: &str) -> Result<Output> {
    let output = command
        .output()
        .with_context(|| format!("running {what}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}
