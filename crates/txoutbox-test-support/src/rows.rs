//! One row by its id, and the attempt log by outcome: where a row is ([`row_status`]), waiting
//! for it to get somewhere ([`wait_for_row`]), how many log entries an outcome has
//! ([`logged`]) and how many one row has ([`attempts_of`]); [`wait_until_for`] waits on the
//! [`Counts`] of one destination. Tests assert on these, not on SQL text.

use std::time::{Duration, Instant};

use anyhow::Result;
use tokio_postgres::Client;
use txoutbox::admin::{AttemptOutcome, MessageStatus};
use uuid::Uuid;

use crate::wait::eventually_some;
use crate::{counts_for, Counts, WAIT_LIMIT};

/// Where the row `id` is now: its hot status, `delivered` or `discarded`; `None` when no table
/// holds it (purged, or never written).
pub async fn row_status(client: &Client, id: Uuid) -> Result<Option<MessageStatus>> {
    crate::counts::status_by(client, "id", &id, &id.to_string()).await
}

/// Reads [`row_status`] every 20 ms until the row `id` is `want`; fails when [`WAIT_LIMIT`]
/// passes first.
pub async fn wait_for_row(client: &Client, id: Uuid, want: MessageStatus) -> Result<()> {
    eventually_some(&format!("the row {id} {want}"), || async {
        Ok((row_status(client, id).await? == Some(want)).then_some(()))
    })
    .await
}

/// The downstream key of the hot row `id` (a replay may have given it a new one).
pub async fn downstream_key_of(client: &Client, id: Uuid) -> Result<String> {
    crate::select::value_with(
        client,
        "SELECT downstream_key FROM txoutbox_messages WHERE id = $1",
        &[&id],
    )
    .await
}

/// Entries of the attempt log with `outcome`, every row and destination together.
pub async fn logged(client: &Client, outcome: AttemptOutcome) -> Result<i64> {
    Ok(client
        .query_one(
            "SELECT count(*) FROM txoutbox_attempts WHERE outcome = $1",
            &[&outcome.as_str()],
        )
        .await?
        .get(0))
}

/// Entries of the attempt log of the row `id` (attempts and operators' actions).
pub async fn attempts_of(client: &Client, id: Uuid) -> Result<i64> {
    Ok(client
        .query_one(
            "SELECT count(*) FROM txoutbox_attempts WHERE message_id = $1",
            &[&id],
        )
        .await?
        .get(0))
}

/// [`wait_until`](crate::wait_until) on the [`Counts`] of one destination's rows.
pub async fn wait_until_for(
    client: &Client,
    destination: &str,
    done: impl Fn(&Counts) -> bool,
) -> Result<Counts> {
    let start = Instant::now();
    loop {
        let now = counts_for(client, destination).await?;
        if done(&now) {
            return Ok(now);
        }
        anyhow::ensure!(
            start.elapsed() < WAIT_LIMIT,
            "the awaited counts of {destination} were not reached in {WAIT_LIMIT:?}; \
             the last counts: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The receipt stored with the delivered row whose downstream key is `downstream_key` (`None`
/// when its sink gave none); fails when no delivered row has that key.
pub async fn receipt_of(client: &Client, downstream_key: &str) -> Result<Option<String>> {
    crate::select::value_with(
        client,
        "SELECT receipt FROM txoutbox_delivered WHERE downstream_key = $1",
        &[&downstream_key],
    )
    .await
}

/// The `attempts` of every row in the delivered history, ascending: how many calls each
/// delivered row took.
pub async fn delivered_attempts(client: &Client) -> Result<Vec<i32>> {
    let rows = client
        .query(
            "SELECT attempts FROM txoutbox_delivered ORDER BY attempts",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Waits until the row with `downstream_key` is `want` (by [`status`](crate::status)); fails
/// when [`WAIT_LIMIT`] passes first.
pub async fn wait_for_key(
    client: &Client,
    downstream_key: &str,
    want: MessageStatus,
) -> Result<()> {
    eventually_some(&format!("the row {downstream_key} {want}"), || async {
        Ok((crate::status(client, downstream_key).await? == Some(want)).then_some(()))
    })
    .await
}

/// One entry of the attempt log, as [`log_of`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The row's downstream key at the attempt or action.
    pub downstream_key: String,
    /// The row's attempt counter (0 for an operator's action).
    pub attempt: i32,
    /// The relay that made the attempt, or `operator`.
    pub relay: String,
    /// The error, or an operator's reason.
    pub error: Option<String>,
}

/// Every attempt-log entry with `outcome`, oldest first.
pub async fn log_of(client: &Client, outcome: AttemptOutcome) -> Result<Vec<LogEntry>> {
    let rows = client
        .query(
            "SELECT downstream_key, attempt, relay, error FROM txoutbox_attempts \
             WHERE outcome = $1 ORDER BY finished_at, downstream_key",
            &[&outcome.as_str()],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| LogEntry {
            downstream_key: r.get(0),
            attempt: r.get(1),
            relay: r.get(2),
            error: r.get(3),
        })
        .collect())
}

/// Checks that there are `n` outbox rows and that each carries the downstream key
/// `consumer`'s inbox derives for `effect` from the message id its payload holds in `field`.
pub async fn assert_keys_derived_from_the_inbox(
    client: &Client,
    field: &str,
    consumer: &str,
    effect: &str,
    n: usize,
) -> Result<()> {
    let rows: Vec<(String, String)> = crate::select::column_pairs_with(
        client,
        "SELECT payload->>$1, downstream_key FROM txoutbox_messages",
        &[&field],
    )
    .await?;
    assert_eq!(rows.len(), n);
    for (id, key) in rows {
        assert_eq!(
            key,
            txoutbox::inbox::derive_inbox_downstream_key(consumer, &id, effect)
        );
    }
    Ok(())
}
