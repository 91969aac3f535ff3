//! The relay against a real Postgres: delivery, retries, dead letters, leases, fencing, ordering,
//! crashes, restarts and shutdown.

use std::time::Duration;

use tokio_postgres::Client;
use txoutbox::{enqueue, OutboxMessage};
use txoutbox_test_support::relay::{RecordingSink, RunningRelay};
use txoutbox_test_support::test_db;

type TestResult = anyhow::Result<()>;

async fn count(client: &Client, sql: &str) -> anyhow::Result<i64> {
    Ok(client.query_one(sql, &[]).await?.get(0))
}

/// Enqueues `n` messages to `destination` with keys `{prefix}-{i}`, in batches of 500.
async fn enqueue_many(
    client: &mut Client,
    destination: &str,
    prefix: &str,
    n: usize,
) -> anyhow::Result<()> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let tx = client.transaction().await?;
        let messages = chunk
            .iter()
            .map(|i| {
                OutboxMessage::new(destination, &serde_json::json!({ "n": i }))
                    .map(|m| m.with_downstream_key(format!("{prefix}-{i}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        enqueue(&tx, &messages).await?;
        tx.commit().await?;
    }
    Ok(())
}

#[tokio::test]
async fn committed_rows_are_delivered_and_leave_the_hot_table() -> TestResult {
    let db = test_db().await?;
    let mut client = db.connect().await?;
    enqueue_many(&mut client, "email", "k", 100).await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("email", sink.clone()).build()?);
    assert_eq!(sink.wait_for(100, Duration::from_secs(20)).await, 100);
    relay.stop().await?;
    assert_eq!(count(&client, "SELECT count(*) FROM txoutbox_messages").await?, 0);
    assert_eq!(
        count(&client, "SELECT count(*) FROM txoutbox_delivered").await?,
        100
    );
    let receipt: String = client
        .query_one(
            "SELECT receipt FROM txoutbox_delivered WHERE downstream_key = 'k-7'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(receipt, "ok:k-7");
    Ok(())
}
