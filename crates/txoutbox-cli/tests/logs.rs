//! The log output of the `txoutbox` binary, as an operator's log shipper reads it: plain text in
//! a file (no colour escapes off a terminal), JSON lines with the delivery's fields, and a
//! Postgres notice kept out of the default log.

use std::fs::File;
use std::process::{Command, Stdio};

use serde_json::Value;
use txoutbox::{enqueue, OutboxMessage};
use txoutbox_test_support::process::terminate;
use txoutbox_test_support::select::value;
use txoutbox_test_support::{test_db, wait_until, TestDb};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn txoutbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_txoutbox"))
}

/// Runs a relay (configured by `configure`) with its stderr in a file until it has
/// dead-lettered one row to a destination it has no sink for (a warning logged inside the row's
/// delivery span), then stops it; returns what it logged.
async fn relay_dead_letters_one_row(
    db: &TestDb,
    configure: impl FnOnce(&mut Command),
) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let mut command = txoutbox();
    command
        .args(["relay", "--stdout", "audit", "--poll-interval", "100ms"])
        .args(["--owner", "relay-under-test"])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .env_remove("TXOUTBOX_LOG_FORMAT")
        .stdout(Stdio::null())
        .stderr(File::create(&log)?);
    configure(&mut command);
    let mut relay = command.spawn()?;
    let mut client = db.connect().await?;
    let tx = client.transaction().await?;
    let message = OutboxMessage::new("nowhere", &serde_json::json!({ "n": 1 }))?
        .with_downstream_key("nowhere-1")
        .with_traceparent(TRACEPARENT)?;
    enqueue(&tx, &[message]).await?;
    tx.commit().await?;
    let failed = wait_until(&client, |c| c.failed >= 1).await;
    terminate(&mut relay)?;
    anyhow::ensure!(failed?.failed == 1, "the row was not dead-lettered");
    Ok(std::fs::read_to_string(&log)?)
}

/// Each line of `text` as JSON; fails naming the line that is not.
fn json_lines(text: &str) -> anyhow::Result<Vec<Value>> {
    text.lines()
        .map(serde_json::from_str::<Value>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("a line is not JSON ({e}): {text}"))
}

/// Runs `txoutbox migrate` on `db` with `configure`'s environment, checks that it succeeded and
/// returns its stderr.
fn migrate(db: &TestDb, configure: impl FnOnce(&mut Command)) -> anyhow::Result<String> {
    let mut command = txoutbox();
    command.arg("migrate").env("DATABASE_URL", db.url());
    configure(&mut command);
    let out = command.output()?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    Ok(err)
}

#[tokio::test]
async fn a_relay_log_written_to_a_file_has_no_escape_byte() -> anyhow::Result<()> {
    let db = test_db().await?;
    let text = relay_dead_letters_one_row(&db, |_| {}).await?;
    assert!(text.contains("dead-lettered"), "{text}");
    assert!(!text.contains('\x1b'), "colour escapes in a file: {text:?}");
    Ok(())
}

#[tokio::test]
async fn a_json_log_line_parses_and_carries_the_delivery_span_fields() -> anyhow::Result<()> {
    let db = test_db().await?;
    let text = relay_dead_letters_one_row(&db, |c| {
        c.args(["--log-format", "json"]);
    })
    .await?;
    let lines = json_lines(&text)?;
    let dead = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("dead-lettered"))
        })
        .ok_or_else(|| anyhow::anyhow!("no dead-letter line: {text}"))?;
    assert_eq!(dead["level"], "WARN", "{dead}");
    let span = &dead["span"];
    assert_eq!(span["name"], "delivery", "{dead}");
    assert_eq!(span["relay"], "relay-under-test", "{dead}");
    assert_eq!(span["destination"], "nowhere", "{dead}");
    assert_eq!(span["downstream_key"], "nowhere-1", "{dead}");
    assert_eq!(
        span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{dead}"
    );
    let client = db.connect().await?;
    let id: uuid::Uuid = value(&client, "SELECT id FROM txoutbox_messages").await?;
    assert_eq!(span["message_id"], id.to_string(), "{dead}");
    Ok(())
}

#[tokio::test]
async fn a_postgres_notice_is_logged_at_debug_in_the_format_txoutbox_log_format_names(
) -> anyhow::Result<()> {
    let db = test_db().await?;
    // The test database is migrated: refinery's CREATE TABLE IF NOT EXISTS draws a notice.
    let err = migrate(&db, |c| {
        c.env("RUST_LOG", "txoutbox=debug")
            .env("TXOUTBOX_LOG_FORMAT", "json");
    })?;
    let lines = json_lines(&err)?;
    let notice = lines
        .iter()
        .find(|l| l["severity"] == "NOTICE")
        .ok_or_else(|| anyhow::anyhow!("no notice logged: {err}"))?;
    assert_eq!(notice["level"], "DEBUG", "{notice}");
    assert!(
        notice["message"]
            .as_str()
            .is_some_and(|m| m.contains("already exists")),
        "{notice}"
    );
    Ok(())
}

#[tokio::test]
async fn a_second_migrate_logs_no_postgres_notice_by_default() -> anyhow::Result<()> {
    let db = test_db().await?;
    for _ in 0..2 {
        let err = migrate(&db, |c| {
            c.env_remove("RUST_LOG");
        })?;
        assert!(
            !err.contains("NOTICE"),
            "a notice at the default level: {err}"
        );
    }
    Ok(())
}
