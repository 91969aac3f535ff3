//! `txoutbox relay` as its own process: delivers, and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use txoutbox::{enqueue, OutboxMessage};
use txoutbox_test_support::test_db;

fn txoutbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_txoutbox"))
}

#[tokio::test]
async fn the_relay_process_delivers_and_exits_0_on_sigterm_leaving_nothing_leased(
) -> anyhow::Result<()> {
    let db = test_db().await?;
    let mut client = db.connect().await?;
    let mut relay = txoutbox()
        .args(["relay", "--stdout", "audit", "--poll-interval", "100ms"])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = relay.stdout.take().expect("piped");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let tx = client.transaction().await?;
    let messages = (0..3)
        .map(|i| {
            OutboxMessage::new("audit", &serde_json::json!({ "n": i }))
                .map(|m| m.with_downstream_key(format!("audit-{i}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    enqueue(&tx, &messages).await?;
    tx.commit().await?;
    let mut got = Vec::new();
    while got.len() < 3 {
        let line = lines.recv_timeout(Duration::from_secs(20))?;
        let value: serde_json::Value = serde_json::from_str(&line)?;
        got.push(
            value["downstream_key"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    got.sort();
    assert_eq!(got, ["audit-0", "audit-1", "audit-2"]);
    let status = Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()?;
    assert!(status.success());
    let start = Instant::now();
    let exit = loop {
        if let Some(exit) = relay.try_wait()? {
            break exit;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = relay.kill();
            anyhow::bail!("the relay did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(0));
    let leased: i64 = client
        .query_one(
            "SELECT count(*) FROM txoutbox_messages WHERE lease_owner IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(leased, 0);
    let delivered: i64 = client
        .query_one("SELECT count(*) FROM txoutbox_delivered", &[])
        .await?
        .get(0);
    assert_eq!(delivered, 3);
    Ok(())
}

#[tokio::test]
async fn a_relay_without_sinks_refuses_to_start() -> anyhow::Result<()> {
    let db = test_db().await?;
    let out = txoutbox()
        .arg("relay")
        .env("DATABASE_URL", db.url())
        .output()?;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no sink configured"), "{err}");
    Ok(())
}

#[test]
fn a_bad_duration_is_a_usage_error() {
    let out = txoutbox()
        .args(["relay", "--lease", "soon"])
        .env("DATABASE_URL", "postgres://x@127.0.0.1:1/x")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}
