//! A real SMTP server for tests: Debian's aiosmtpd (`apt-get install python3-aiosmtpd`), run with
//! `/usr/bin/python3` on a free loopback port by the handler script `tests/support/smtp_server.py`.
//!
//! The server stores every accepted message; [`SmtpServer::fail_next`] makes it answer the next
//! messages with a given reply (`451 …`, `550 …`); [`SmtpServer::stop`] and
//! [`SmtpServer::restart`] take it down and bring it back on the same port. The process is killed
//! when the handle drops, and exits by itself if the test process dies first (or after ten minutes).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The interpreter with Debian's aiosmtpd (not a pyenv `python3` that may be first on `PATH`).
pub const PYTHON: &str = "/usr/bin/python3";

/// The handler script, shipped in the test-support crate and handed to Python with `-c`.
const SCRIPT: &str = include_str!("../smtp_server.py");

/// How long the server may take to start listening.
const START_LIMIT: Duration = Duration::from_secs(15);

/// A message as the server received it, decoded by Python's `email` package.
#[derive(Debug, Clone, Deserialize)]
pub struct ReceivedMail {
    /// The name the client gave in `EHLO` (or `HELO`); `None` for a parsed file.
    #[serde(default)]
    pub ehlo: Option<String>,
    /// The envelope sender (`MAIL FROM`); `None` for a parsed file.
    pub mail_from: Option<String>,
    /// The envelope recipients (`RCPT TO`), Bcc included; empty for a parsed file.
    pub rcpt_tos: Vec<String>,
    /// Every header, in order, with RFC 2047 words decoded.
    pub headers: Vec<(String, String)>,
    /// The text/plain body, if any.
    pub text: Option<String>,
    /// The text/html body, if any.
    pub html: Option<String>,
    /// The message as sent.
    pub raw: String,
    /// For a rejected message: the reply the server gave.
    #[serde(default)]
    pub reply: Option<String>,
}

impl ReceivedMail {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of the headers named `name` (case-insensitive).
    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The `Message-ID` header.
    pub fn message_id(&self) -> Option<&str> {
        self.header("Message-ID")
    }
}

/// Options of a server: none are needed for the common case.
#[derive(Debug, Clone, Default)]
pub struct SmtpServerOptions {
    /// Require `AUTH` (PLAIN/LOGIN, over plain text) with this user and password.
    pub auth: Option<(String, String)>,
}

/// A running (or stopped) aiosmtpd server with a store of its own.
pub struct SmtpServer {
    port: u16,
    dir: tempfile::TempDir,
    options: SmtpServerOptions,
    child: Option<Child>,
    failures_written: AtomicUsize,
}

impl SmtpServer {
    /// Starts a server on a free loopback port.
    pub async fn start() -> Result<Self> {
        Self::start_with(SmtpServerOptions::default()).await
    }

    /// Starts a server with `options`.
    pub async fn start_with(options: SmtpServerOptions) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("txoutbox-smtp-")
            .tempdir()
            .context("creating the SMTP server's directory")?;
        let mut server = Self {
            port: 0,
            dir,
            options,
            child: None,
            failures_written: AtomicUsize::new(0),
        };
        server.spawn().await?;
        Ok(server)
    }

    /// The port it listens on (kept across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `smtp://127.0.0.1:{port}`: plain SMTP, what `EmailSink::smtp` takes.
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// True while the server process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (connections drop, the port is closed); stored messages stay.
    pub async fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.start_kill().ok();
            tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .context("the SMTP server did not exit within 10 s")??;
        }
        Ok(())
    }

    /// Starts the server again on the same port (stopping it first if it runs).
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.spawn().await
    }

    /// The next `n` messages are answered with `reply` (for example `"451 4.3.0 Try again later"`
    /// or `"550 5.1.1 No such user"`) instead of being accepted.
    pub fn fail_next(&self, n: usize, reply: &str) -> Result<()> {
        let failures = self.dir.path().join("failures");
        std::fs::create_dir_all(&failures)?;
        for _ in 0..n {
            // Names in write order: the server takes the oldest first.
            let i = self.failures_written.fetch_add(1, Ordering::Relaxed);
            // Written aside and renamed, so the server never takes a half-written reply.
            let tmp = self.dir.path().join(format!(".failure-{i}"));
            std::fs::write(&tmp, reply)?;
            std::fs::rename(&tmp, failures.join(format!("{i:08}")))?;
        }
        Ok(())
    }

    /// Scripted failures not yet used.
    pub fn failures_left(&self) -> Result<usize> {
        let failures = self.dir.path().join("failures");
        if !failures.exists() {
            return Ok(0);
        }
        Ok(std::fs::read_dir(failures)?.count())
    }

    /// Every message accepted so far, in arrival order.
    pub fn messages(&self) -> Result<Vec<ReceivedMail>> {
        read_store(&self.dir.path().join("accepted"))
    }

    /// Every message answered with a scripted failure, in arrival order.
    pub fn rejected(&self) -> Result<Vec<ReceivedMail>> {
        read_store(&self.dir.path().join("rejected"))
    }

    /// Waits until at least `n` messages were accepted, or `limit` passes; returns them all.
    pub async fn wait_for_messages(&self, n: usize, limit: Duration) -> Result<Vec<ReceivedMail>> {
        let start = Instant::now();
        loop {
            let messages = self.messages()?;
            if messages.len() >= n || start.elapsed() >= limit {
                return Ok(messages);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn spawn(&mut self) -> Result<()> {
        let mut command = Command::new(PYTHON);
        command
            .arg("-c")
            .arg(SCRIPT)
            .arg("serve")
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some((user, password)) = &self.options.auth {
            command.arg("--auth").arg(format!("{user}:{password}"));
        }
        let mut child = command.spawn().with_context(|| {
            format!("starting {PYTHON} (aiosmtpd: apt-get install python3-aiosmtpd)")
        })?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(START_LIMIT, lines.next_line()).await;
        let line = match ready {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) | Ok(Err(_)) => {
                let status = child.wait().await.ok();
                bail!(
                    "the SMTP server exited before listening ({status:?}); is python3-aiosmtpd \
                     installed for {PYTHON}? (apt-get install python3-aiosmtpd)"
                );
            }
            Err(_) => bail!("the SMTP server did not listen within {START_LIMIT:?}"),
        };
        let port: u16 = line
            .strip_prefix("READY ")
            .and_then(|p| p.trim().parse().ok())
            .with_context(|| format!("unexpected line from the SMTP server: {line:?}"))?;
        self.port = port;
        self.child = Some(child);
        Ok(())
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            child.start_kill().ok();
        }
    }
}

/// Parses an `.eml` file with the same decoder the server uses.
pub fn parse_eml(path: &Path) -> Result<ReceivedMail> {
    let mut parse = std::process::Command::new(PYTHON);
    parse.arg("-c").arg(SCRIPT).arg("parse").arg(path);
    let what = format!("{PYTHON} parsing {}", path.display());
    let stdout = crate::process::run_to_end(parse.stdin(Stdio::null()), &what)?;
    Ok(serde_json::from_slice(&stdout)?)
}

fn read_store(dir: &Path) -> Result<Vec<ReceivedMail>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p)?;
            serde_json::from_slice(&bytes).with_context(|| format!("reading {}", p.display()))
        })
        .collect()
}
