//! `txoutbox relays`: the relays that recorded themselves, as an operator reads them.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use txoutbox_test_support::process::terminate;
use txoutbox_test_support::{test_db_with_client, TestDb};

fn txoutbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_txoutbox"))
}

fn relays(db: &TestDb, args: &[&str]) -> anyhow::Result<Output> {
    Ok(txoutbox()
        .arg("relays")
        .args(args)
        .env("DATABASE_URL", db.url())
        .output()?)
}

/// Runs `txoutbox relays` until its output satisfies `done` (at most 30 s): the output.
fn relays_until(db: &TestDb, done: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        let out = relays(db, &[])?;
        anyhow::ensure!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout)?;
        if done(&text) {
            return Ok(text);
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "never: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn relay_process(db: &TestDb) -> anyhow::Result<Child> {
    Ok(txoutbox()
        .args(["relay", "--stdout", "audit", "--stdout", "ledger"])
        .args(["--heartbeat", "200ms", "--owner", "relay-one"])
        .args(["--rate-limit", "audit=20/s", "--max-in-flight", "ledger=4"])
        .args(["--at-most-once", "ledger"])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?)
}

#[tokio::test]
async fn relays_lists_each_relay_with_its_state_sinks_and_bounds() -> anyhow::Result<()> {
    let (db, client) = test_db_with_client().await?;
    let none = relays(&db, &[])?;
    assert!(none.status.success());
    assert_eq!(String::from_utf8(none.stdout)?, "no relay alive\n");

    let mut relay = relay_process(&db)?;
    let text = relays_until(&db, |text| text.contains("relay-one"))?;
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    assert!(header.starts_with("STATE  OWNER"), "{text}");
    for column in ["HEARTBEAT", "LAST CLAIM", "HELD", "SINKS", "BOUNDS"] {
        assert!(header.contains(column), "{column}: {text}");
    }
    let row = lines.next().unwrap_or_default();
    assert!(row.starts_with("alive  relay-one"), "{text}");
    assert!(row.contains("audit,ledger"), "sinks: {row}");
    assert!(
        row.contains("concurrency 64, audit 20/s, ledger ≤4 in flight at most once"),
        "bounds: {row}"
    );
    assert!(text.ends_with("\n1 relay alive\n"), "{text}");

    // A row another program left behind: silent for an hour, with values no relay writes.
    client
        .batch_execute(
            "INSERT INTO txoutbox_relays (owner, host, pid, version, heartbeat_every, heartbeat_at, \
                 held, sinks, flow) \
             VALUES ('relay-gone', 'elsewhere', -1, 'x', interval '5 s', \
                 now() - interval '1 hour', -3, ARRAY[NULL, 'email'], '[1, \"not an object\"]')",
        )
        .await?;
    let text = relays_until(&db, |text| text.contains("relay-gone"))?;
    let gone = text
        .lines()
        .find(|l| l.contains("relay-gone"))
        .unwrap_or_default();
    assert!(gone.starts_with("STALE  relay-gone  elsewhere"), "{text}");
    assert!(gone.contains("1h ago"), "its heartbeat's age: {gone}");
    assert!(text.ends_with("\n1 relay alive, 1 stale\n"), "{text}");

    let json = relays(&db, &["--json"])?;
    assert!(json.status.success());
    let listed: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    let owners: Vec<(&str, bool)> = listed
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r["owner"].as_str().unwrap_or(""), r["stale"] == true))
        .collect();
    assert_eq!(owners, [("relay-one", false), ("relay-gone", true)]);

    // A clean exit deletes the relay's row.
    assert_eq!(terminate(&mut relay)?, Some(0));
    let text = relays_until(&db, |text| !text.contains("relay-one"))?;
    assert!(text.ends_with("\nno relay alive, 1 stale\n"), "{text}");
    Ok(())
}
