//! A row whose stored payload this build cannot decode (written by another program: JSON
//! Postgres accepts and serde_json refuses), handled by an operator with the `txoutbox` binary:
//! the relay dead-letters it, `show` prints its stored text marked as not decodable, `list`
//! lists it, `replay` and `discard` act on it.

use std::process::Command;

use serde_json::Value;
use txoutbox::admin::{AttemptOutcome, MessageStatus};
use txoutbox_test_support::factory::{message, nested_too_deep};
use txoutbox_test_support::process::terminate;
use txoutbox_test_support::relay::{relay_config, RecordingSink, RunningRelay};
use txoutbox_test_support::{
    assert_outcomes, counts, eventually_some, outcomes, status, test_db, test_db_with_sql,
    wait_until, TestDb,
};

mod support;
use support::ok;

type TestResult = anyhow::Result<()>;

/// Waits until the hostile row is `want`.
async fn wait_for_status(db: &TestDb, want: MessageStatus) -> anyhow::Result<()> {
    let client = db.connect().await?;
    eventually_some(&format!("the hostile row {want}"), || async {
        Ok((status(&client, "hostile").await? == Some(want)).then_some(()))
    })
    .await
}

#[tokio::test]
async fn an_undecodable_row_is_shown_listed_replayed_and_discarded_with_the_cli() -> TestResult {
    let db = test_db().await?;
    let deep = nested_too_deep();
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
    wait_for_status(&db, MessageStatus::Failed).await?;

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
    let client = db.connect().await?;
    eventually_some("the replayed row dead-lettered again", || async {
        let log = outcomes(&client, "hostile").await?;
        Ok((log.iter().filter(|o| **o == AttemptOutcome::Failed).count() == 2).then_some(()))
    })
    .await?;
    assert_outcomes(
        &client,
        "hostile",
        [
            AttemptOutcome::Failed,
            AttemptOutcome::Replayed,
            AttemptOutcome::Failed,
        ],
    )
    .await?;
    wait_for_status(&db, MessageStatus::Failed).await?;

    ok(&db, &["discard", &id, "--reason", "written by hand"]).await?;
    relay.stop().await?;
    let after = counts(&client).await?;
    assert_eq!((after.discarded, after.delivered), (1, 3));
    let shown = ok(&db, &["show", &id]).await?;
    assert!(shown.contains("discarded"), "{shown}");
    assert!(shown.contains("not decodable"), "{shown}");
    Ok(())
}

#[tokio::test]
async fn the_relay_process_delivers_the_batch_mates_of_a_row_inserted_with_psql() -> TestResult {
    // As an operator would with psql, into a migrated database.
    let (db, client) = test_db_with_sql(
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
    let delivered = wait_until(&client, |c| c.delivered >= 30).await;
    let failed = wait_for_status(&db, MessageStatus::Failed).await;
    let exit = terminate(&mut relay)?;
    let mut log = String::new();
    if let Some(mut stderr) = relay.stderr.take() {
        std::io::Read::read_to_string(&mut stderr, &mut log)?;
    }
    assert_eq!(delivered?.delivered, 30, "{log}");
    failed?;
    assert_eq!(exit, Some(0), "{log}");
    assert!(!log.contains("unavailable"), "{log}");
    assert!(log.contains("undecodable row; dead-lettered"), "{log}");
    Ok(())
}
