//! A row whose stored payload this build cannot decode (written by another program: JSON
//! Postgres accepts and serde_json refuses), handled by an operator with the `txoutbox` binary:
//! the relay dead-letters it, `show` prints its stored text marked as not decodable, `list`
//! lists it, `replay` and `discard` act on it.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use txoutbox_test_support::factory::message;
use txoutbox_test_support::relay::{relay_config, RecordingSink, RunningRelay};
use txoutbox_test_support::{count, test_db, wait_for_exact_count, TestDb};

mod support;
use support::ok;

type TestResult = anyhow::Result<()>;

/// The hostile row's status, once it is the one given.
async fn wait_for_status(db: &TestDb, status: &str) -> anyhow::Result<()> {
    let client = db.connect().await?;
    wait_for_exact_count(
        &client,
        &format!(
            "SELECT count(*) FROM txoutbox_messages \
             WHERE downstream_key = 'hostile' AND status = '{status}'"
        ),
        1,
        Duration::from_secs(20),
    )
    .await
}

#[tokio::test]
async fn an_undecodable_row_is_shown_listed_replayed_and_discarded_with_the_cli() -> TestResult {
    let db = test_db().await?;
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let id = message(&db)
        .key("hostile")
        .stored_payload(&deep)
        .create()
        .await?
        .to_string();
    message(&db).key("ordinary").create_many(3).await?;
    let relay = RunningRelay::start(
        db.relay()?
            .config(relay_config())
            .sink("test", RecordingSink::new())
            .build()?,
    );
    wait_for_status(&db, "failed").await?;

    let shown = ok(&db, &["show", &id]).await?;
    assert!(
        shown.contains("payload (not decodable: recursion limit exceeded"),
        "{shown}"
    );
    assert!(shown.contains(&deep), "the stored text is printed: {shown}");
    assert!(
        shown.contains("the stored payload is not valid for this relay"),
        "{shown}"
    );
    let json: Value = serde_json::from_str(&ok(&db, &["show", &id, "--json"]).await?)?;
    assert_eq!(json["payload"]["text"], deep.as_str());
    assert!(
        json["payload"]["undecodable"]
            .as_str()
            .is_some_and(|e| e.contains("recursion limit exceeded")),
        "{json}"
    );

    let listed = ok(&db, &["list", "--status", "failed"]).await?;
    assert!(listed.contains(&id), "{listed}");

    ok(&db, &["replay", &id]).await?;
    // Replayed, it is claimed and dead-lettered again, on its own.
    wait_for_exact_count(
        &db.connect().await?,
        "SELECT count(*) FROM txoutbox_attempts \
         WHERE downstream_key = 'hostile' AND outcome = 'failed'",
        2,
        Duration::from_secs(20),
    )
    .await?;
    wait_for_status(&db, "failed").await?;

    ok(&db, &["discard", &id, "--reason", "written by hand"]).await?;
    relay.stop().await?;
    let client = db.connect().await?;
    assert_eq!(count(&client, "txoutbox_discarded").await?, 1);
    assert_eq!(count(&client, "txoutbox_delivered").await?, 3);
    let shown = ok(&db, &["show", &id]).await?;
    assert!(shown.contains("discarded"), "{shown}");
    assert!(shown.contains("not decodable"), "{shown}");
    Ok(())
}

/// Sends SIGTERM to `relay` and waits (at most 20 s) for its exit code.
fn terminate(relay: &mut std::process::Child) -> anyhow::Result<Option<i32>> {
    let status = Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -TERM failed");
    let start = std::time::Instant::now();
    loop {
        if let Some(exit) = relay.try_wait()? {
            return Ok(exit.code());
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = relay.kill();
            anyhow::bail!("the relay did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn the_relay_process_delivers_the_batch_mates_of_a_row_inserted_with_psql() -> TestResult {
    let db = test_db().await?;
    let client = db.connect().await?;
    // As an operator would with psql, into a migrated database.
    client
        .batch_execute(
            "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key) \
             VALUES (gen_random_uuid(), 'out', \
                 (repeat('[',200)||'1'||repeat(']',200))::jsonb, 'hostile')",
        )
        .await?;
    message(&db)
        .destination("out")
        .key("ordinary")
        .create_many(30)
        .await?;
    let mut relay = Command::new(env!("CARGO_BIN_EXE_txoutbox"))
        .args(["relay", "--stdout", "out", "--lease", "6s"])
        .args(["--poll-interval", "100ms"])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let delivered = txoutbox_test_support::wait_for_count(
        &client,
        "SELECT count(*) FROM txoutbox_delivered",
        30,
        Duration::from_secs(20),
    )
    .await;
    let failed = wait_for_status(&db, "failed").await;
    let exit = terminate(&mut relay)?;
    let mut log = String::new();
    if let Some(mut stderr) = relay.stderr.take() {
        std::io::Read::read_to_string(&mut stderr, &mut log)?;
    }
    assert_eq!(delivered?, 30, "{log}");
    failed?;
    assert_eq!(exit, Some(0), "{log}");
    assert!(!log.contains("unavailable"), "{log}");
    assert!(log.contains("undecodable row; dead-lettered"), "{log}");
    Ok(())
}
