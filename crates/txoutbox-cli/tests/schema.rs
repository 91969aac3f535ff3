//! Every command against a database whose schema is not the version this build needs (never
//! migrated, behind, or migrated by a newer txoutbox), run as a user runs it: one line that says
//! what to run, from the relay (exit 1, and `/readyz` 503 while it runs), the operator's
//! commands (exit 1), `migrate` (a schema is never migrated down) and the dashboard (503 until
//! the schema matches, then it serves without a restart).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use txoutbox_test_support::process::OwnedChild;
use txoutbox_test_support::process::{http_get, wait_for_get};
use txoutbox_test_support::{
    drop_schema, forget_last_migration, free_addr, latest_migration, record_newer_migration,
    test_db, test_db_with_client, TestDb,
};

type TestResult = anyhow::Result<()>;

/// The line for a database at `current`, behind this build.
fn behind(current: i32) -> String {
    format!(
        "the database schema is at version {current}, this txoutbox needs {}: run `txoutbox migrate`",
        latest_migration()
    )
}

/// The line for a database at `current`, ahead of this build.
fn ahead(current: i32) -> String {
    format!(
        "the database schema is at version {current}, this txoutbox knows only up to {}: \
         upgrade txoutbox (a schema is never migrated down)",
        latest_migration()
    )
}

fn txoutbox(db: &TestDb) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_txoutbox"));
    command
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn");
    command
}

/// A database of the test's own that `txoutbox migrate` never ran on.
async fn never_migrated() -> anyhow::Result<TestDb> {
    let db = test_db().await?;
    drop_schema(&db.connect().await?).await?;
    Ok(db)
}

/// A child process, killed when dropped.
struct Running(OwnedChild);

impl Running {
    /// The exit status, if the process ends within `limit`.
    fn exit_within(&mut self, limit: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.0.try_wait()? {
                return Ok(Some(status));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(None)
    }

    /// Everything the process wrote on stderr (once it has ended or been killed).
    fn stderr(&mut self) -> anyhow::Result<String> {
        let _ = self.0.kill();
        self.0.wait()?;
        let mut err = String::new();
        if let Some(mut stderr) = self.0.stderr.take() {
            stderr.read_to_string(&mut err)?;
        }
        Ok(err)
    }
}

/// `txoutbox relay --stdout audit --metrics-addr ADDR` on `db`.
fn relay(db: &TestDb, metrics: SocketAddr) -> anyhow::Result<Running> {
    Ok(Running(
        txoutbox(db)
            .args(["relay", "--stdout", "audit", "--poll-interval", "100ms"])
            .args(["--metrics-addr", &metrics.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?
            .into(),
    ))
}

/// Runs `txoutbox ARGS` on `db` to its end (off the async workers).
async fn output(db: &TestDb, args: &[&str]) -> anyhow::Result<Output> {
    let mut command = txoutbox(db);
    command.args(args);
    Ok(tokio::task::spawn_blocking(move || command.output()).await??)
}

#[tokio::test]
async fn the_relay_exits_1_with_the_line_on_a_database_never_migrated() -> TestResult {
    let db = never_migrated().await?;
    let mut relay = relay(&db, free_addr()?)?;
    let exit = relay.exit_within(Duration::from_secs(20))?;
    let err = relay.stderr()?;
    assert_eq!(exit.and_then(|e| e.code()), Some(1), "{err}");
    assert!(err.contains(&format!("error: {}\n", behind(0))), "{err}");
    Ok(())
}

#[tokio::test]
async fn the_relay_exits_1_with_the_reverse_line_on_a_schema_a_newer_txoutbox_migrated(
) -> TestResult {
    let db = test_db().await?;
    let newer = record_newer_migration(&db.connect().await?).await?;
    let mut relay = relay(&db, free_addr()?)?;
    let exit = relay.exit_within(Duration::from_secs(20))?;
    let err = relay.stderr()?;
    assert_eq!(exit.and_then(|e| e.code()), Some(1), "{err}");
    assert!(err.contains(&format!("error: {}\n", ahead(newer))), "{err}");
    Ok(())
}

#[tokio::test]
async fn readyz_turns_503_with_the_line_when_the_schema_falls_behind() -> TestResult {
    let db = test_db().await?;
    let metrics = free_addr()?;
    let _relay = relay(&db, metrics)?;
    wait_for_get(metrics, "/readyz", |status, _| status == 200).await?;
    let current = forget_last_migration(&db.connect().await?).await?;
    let (_, reason) = wait_for_get(metrics, "/readyz", |status, _| status == 503).await?;
    assert_eq!(reason, format!("not ready: {}\n", behind(current)));
    Ok(())
}

#[tokio::test]
async fn readyz_is_503_while_a_newer_txoutbox_migrated_the_schema_and_200_once_it_is_not(
) -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let metrics = free_addr()?;
    let _relay = relay(&db, metrics)?;
    wait_for_get(metrics, "/readyz", |status, _| status == 200).await?;
    let newer = record_newer_migration(&client).await?;
    let (_, reason) = wait_for_get(metrics, "/readyz", |status, _| status == 503).await?;
    assert_eq!(reason, format!("not ready: {}\n", ahead(newer)));
    client
        .execute(
            "DELETE FROM txoutbox_schema_history WHERE version = $1",
            &[&newer],
        )
        .await?;
    wait_for_get(metrics, "/readyz", |status, _| status == 200).await?;
    Ok(())
}

#[tokio::test]
async fn stats_list_and_show_exit_1_with_the_line_on_a_database_never_migrated() -> TestResult {
    let db = never_migrated().await?;
    for args in [
        &["stats"][..],
        &["list"],
        &["show", "0190a5d2-7c4e-7000-8000-000000000001"],
    ] {
        let out = output(&db, args).await?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err, format!("error: {}\n", behind(0)), "{args:?}");
    }
    Ok(())
}

#[tokio::test]
async fn migrate_refuses_a_schema_newer_than_the_binary_with_the_reverse_line() -> TestResult {
    let db = test_db().await?;
    let newer = record_newer_migration(&db.connect().await?).await?;
    let out = output(&db, &["migrate"]).await?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err, format!("error: {}\n", ahead(newer)));
    Ok(())
}

#[tokio::test]
async fn the_dashboard_answers_503_with_the_line_until_migrate_runs_then_serves() -> TestResult {
    let db = never_migrated().await?;
    let mut dashboard = Running(
        txoutbox(&db)
            .args(["dashboard", "--addr", "127.0.0.1:0"])
            .env_remove("TXOUTBOX_DASHBOARD_USERS")
            .env_remove("TXOUTBOX_DASHBOARD_ADDR")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?
            .into(),
    );
    let mut line = String::new();
    if let Some(stdout) = dashboard.0.stdout.take() {
        BufReader::new(stdout).read_line(&mut line)?;
    }
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("dashboard on http://")
        .ok_or_else(|| anyhow::anyhow!("no address printed: {line:?}"))?
        .parse()?;
    let (status, page) = http_get(addr, "/").await?;
    assert_eq!(status, 503, "{page}");
    assert!(page.contains(&behind(0)), "{page}");
    let (status, body) = http_get(addr, "/api/stats").await?;
    assert_eq!(status, 503, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(answer["error"], behind(0));
    let migrated = output(&db, &["migrate"]).await?;
    assert!(migrated.status.success(), "{migrated:?}");
    let (_, body) = wait_for_get(addr, "/api/stats", |status, _| status == 200).await?;
    assert!(body.contains("\"total\""), "{body}");
    let err = dashboard.stderr()?;
    assert!(err.contains(&format!("warning: {}", behind(0))), "{err}");
    Ok(())
}
