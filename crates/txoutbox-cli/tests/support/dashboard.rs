//! `txoutbox dashboard` run as a user runs it: started on a database URL, its address read from
//! what it prints, and plain HTTP/1.1 to it. Each test file that includes it uses a part.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use txoutbox_test_support::process::{first_stdout_line, OwnedChild};

/// The running command; killed when dropped.
pub struct Served {
    _child: OwnedChild,
    /// The address it printed.
    pub addr: String,
    /// The first line it wrote to stderr (its warning, if any), when no `--user` was given.
    pub stderr: String,
}

/// The `txoutbox` binary, inheriting none of libpq's TLS variables nor `PGHOST`: the URL says
/// how to connect.
pub fn txoutbox() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_txoutbox"));
    for name in [
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGSSLCERT",
        "PGSSLKEY",
        "PGHOST",
    ] {
        command.env_remove(name);
    }
    command
}

/// Starts `txoutbox dashboard ARGS` on `url` and waits for the address it prints. The
/// dashboard's own variables are not inherited either: the arguments say everything.
pub fn serve(url: &str, args: &[&str]) -> anyhow::Result<Served> {
    let mut command = txoutbox();
    command
        .arg("dashboard")
        .args(args)
        .env("DATABASE_URL", url)
        .env_remove("TXOUTBOX_DASHBOARD_USERS")
        .env_remove("TXOUTBOX_DASHBOARD_ADDR")
        .env_remove("TXOUTBOX_DASHBOARD_ALLOWED_HOSTS");
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let line = first_stdout_line(&mut child)?;
    let addr = line
        .trim()
        .strip_prefix("dashboard on http://")
        .map(str::to_owned);
    let mut stderr = String::new();
    let Some(addr) = addr else {
        if let Some(mut err) = child.stderr.take() {
            err.read_to_string(&mut stderr)?;
        }
        anyhow::bail!("no address printed: {line:?} {stderr}");
    };
    // The warning (if any) is written before the address.
    if let Some(err) = child.stderr.take() {
        let mut first = String::new();
        let mut reader = BufReader::new(err);
        if args.iter().all(|a| !a.starts_with("--user")) {
            reader.read_line(&mut first)?;
        }
        stderr = first;
    }
    Ok(Served {
        _child: child.into(),
        addr,
        stderr,
    })
}

/// `GET path` over plain HTTP/1.1: the status line and the whole answer.
pub fn get(addr: &str, path: &str, authorization: Option<&str>) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}
