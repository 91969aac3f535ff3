//! `txoutbox dashboard`, run as a user runs it: the binary serving real HTTP.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use txoutbox_test_support::process::terminate;
use txoutbox_test_support::select::value;
use txoutbox_test_support::{rebound_pause, request_text, test_db, test_db_with_client, TestDb};

#[path = "support/dashboard.rs"]
mod dashboard;

use dashboard::{get, Served};

/// Starts `txoutbox dashboard ARGS` on `db` and waits for the address it prints.
fn serve(db: &TestDb, args: &[&str]) -> anyhow::Result<Served> {
    dashboard::serve(&db.url(), args)
}

/// A test database, and `txoutbox dashboard ARGS` serving it.
async fn served(args: &[&str]) -> anyhow::Result<(TestDb, Served)> {
    let db = test_db().await?;
    let served = serve(&db, args)?;
    Ok((db, served))
}

#[tokio::test]
async fn dashboard_without_users_listens_on_loopback_only_and_says_so() -> anyhow::Result<()> {
    let (_db, served) = served(&["--addr", "0.0.0.0:0"]).await?;
    assert!(served.addr.starts_with("127.0.0.1:"), "{}", served.addr);
    assert!(served.stderr.contains("loopback only"), "{}", served.stderr);
    let answer = get(&served.addr, "/api/stats", None)?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"total\""), "{answer}");
    Ok(())
}

/// `GET path` addressed to `host` (what a page of the site `host` sends from a visitor's browser,
/// once its name resolves to the dashboard's address), as [`send_to`] sends it.
fn get_text(path: &str, host: &str) -> String {
    request_text("GET", path, host, &[], "")
}

/// Sends `request` (the text of an HTTP/1.1 request) to `addr`: the whole answer.
fn send_to(addr: &str, request: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.write_all(request.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

#[tokio::test]
async fn dashboard_without_users_refuses_requests_addressed_to_another_host() -> anyhow::Result<()>
{
    let (db, served) = served(&["--addr", "127.0.0.1:0"]).await?;
    let port = served.addr.rsplit(':').next().unwrap_or_default();
    let host = format!("rebind.attacker.example:{port}");

    let answer = send_to(&served.addr, &rebound_pause("", &host))?;
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    let answer = send_to(&served.addr, &get_text("/api/destinations", &host))?;
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    let paused = db
        .connect()
        .await?
        .query_opt(
            "SELECT 1 FROM txoutbox_destinations WHERE destination = 'email'",
            &[],
        )
        .await?;
    assert!(paused.is_none(), "nothing paused");
    let local = send_to(
        &served.addr,
        &get_text("/api/stats", &format!("localhost:{port}")),
    )?;
    assert!(local.starts_with("HTTP/1.1 200"), "{local}");
    Ok(())
}

#[tokio::test]
async fn dashboard_without_users_answers_an_allowed_host() -> anyhow::Result<()> {
    let (_db, served) = served(&["--addr", "127.0.0.1:0", "--allowed-host", "ops.example"]).await?;
    let answer = send_to(&served.addr, &get_text("/api/stats", "ops.example"))?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answer = send_to(&served.addr, &get_text("/api/stats", "evil.example"))?;
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    Ok(())
}

#[tokio::test]
async fn dashboard_with_users_asks_for_credentials() -> anyhow::Result<()> {
    let (_db, served) = served(&["--addr", "127.0.0.1:0", "--user", "alice:pw:operator"]).await?;
    let answer = get(&served.addr, "/", None)?;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    // alice:pw
    let answer = get(&served.addr, "/", Some("Basic YWxpY2U6cHc="))?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("<h1>Overview</h1>"), "{answer}");
    Ok(())
}

#[test]
fn a_malformed_user_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_txoutbox"))
        .args(["dashboard", "--user", "alice:pw:admin"])
        .env("DATABASE_URL", "postgres://localhost/none")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a role"));
}

/// Starts `txoutbox relay` named `owner`, beating every 200 ms, delivering `audit` to stdout.
fn relay_process(db: &TestDb, owner: &str) -> anyhow::Result<Child> {
    Ok(Command::new(env!("CARGO_BIN_EXE_txoutbox"))
        .args(["relay", "--stdout", "audit", "--heartbeat", "200ms"])
        .args(["--owner", owner])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?)
}

/// The `<tr …>` of the Relays page's table that names `owner` (empty when none does).
fn relay_row<'a>(page: &'a str, owner: &str) -> &'a str {
    page.split("<tr")
        .find(|row| row.contains(&format!(r#"<code class="id">{owner}</code>"#)))
        .unwrap_or("")
}

/// Reads `/relays` until `done` holds for it (at most 30 s): the page.
fn relays_page_until(addr: &str, done: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    let started = std::time::Instant::now();
    loop {
        let page = get(addr, "/relays", None)?;
        if done(&page) {
            return Ok(page);
        }
        anyhow::ensure!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the Relays page never showed what was awaited: {page}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[tokio::test]
async fn the_relays_page_lists_running_relays_and_marks_a_killed_one_stale() -> anyhow::Result<()> {
    let (db, client) = test_db_with_client().await?;
    let served = serve(&db, &["--addr", "127.0.0.1:0"])?;
    let mut kept = relay_process(&db, "relay-kept")?;
    let mut killed = relay_process(&db, "relay-killed")?;

    let page = relays_page_until(&served.addr, |page| page.contains("2 relays alive"))?;
    for owner in ["relay-kept", "relay-killed"] {
        let row = relay_row(&page, owner);
        assert!(row.starts_with(r#" class="alive""#), "{owner}: {row}");
        assert!(
            row.contains(r#"<code class="id">audit</code>"#),
            "its sinks: {row}"
        );
        assert!(row.contains("every 200ms"), "its heartbeat: {row}");
    }

    // SIGKILL: no clean exit, its heartbeat just stops.
    killed.kill()?;
    killed.wait()?;
    let page = relays_page_until(&served.addr, |page| {
        relay_row(page, "relay-killed").starts_with(r#" class="stale""#)
    })?;
    assert!(page.contains("1 relay alive"), "{page}");
    assert!(relay_row(&page, "relay-kept").starts_with(r#" class="alive""#));
    // Stale once three heartbeats were missed, not before.
    let silent: f64 = value(
        &client,
        "SELECT EXTRACT(EPOCH FROM now() - heartbeat_at)::float8 FROM txoutbox_relays \
             WHERE owner = 'relay-killed'",
    )
    .await?;
    assert!(silent >= 0.6, "marked stale after {silent} s of silence");

    // A clean exit deletes the relay's row; the killed one's stays, stale.
    assert_eq!(terminate(&mut kept)?, Some(0));
    let page = relays_page_until(&served.addr, |page| !page.contains("relay-kept"))?;
    assert!(page.contains("No relay alive"), "{page}");
    assert!(relay_row(&page, "relay-killed").starts_with(r#" class="stale""#));
    Ok(())
}
