//! The batch-job path: rows enqueued with `txoutbox::enqueue` and keys of the soak's own
//! (`soak-<row>`), a few per transaction; and the hostile rows, stored with SQL with payloads
//! Postgres accepts and serde_json refuses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deadpool_postgres::Pool;
use txoutbox::OutboxMessage;

use super::plan::{self, Plan, RowPlan};

/// An undecodable row: valid jsonb, but nested deeper than serde_json's limit of 128 (even
/// rows) or with a number no f64 holds (odd rows); `data.row` names the row either way.
fn undecodable_payload(row: usize) -> String {
    if row.is_multiple_of(2) {
        format!(
            r#"{{"event_type":"soak.row","data":{{"row":{row}}},"deep":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        )
    } else {
        format!(r#"{{"event_type":"soak.row","data":{{"row":{row}}},"n":1e400}}"#)
    }
}

const INSERT_UNDECODABLE: &str = "INSERT INTO txoutbox_messages \
     (id, destination, payload, downstream_key) VALUES ($1, $2, $3::text::jsonb, $4) \
     ON CONFLICT (destination, downstream_key) DO NOTHING";

/// Enqueues every batch row at its time, a few rows per transaction, in the plan's order (so
/// the rows of an ordering key commit in their order). A transaction that fails (Postgres
/// restarting) is tried again: enqueue deduplicates on the downstream key, so a commit whose
/// answer was lost is not doubled. Rows written by requests are left to them.
pub async fn enqueue_all(pool: Pool, plan: Arc<Plan>, epoch: Instant) -> Result<()> {
    let mut rows: Vec<&RowPlan> = plan.rows.iter().filter(|r| r.request.is_none()).collect();
    rows.sort_by_key(|r| (r.enqueue_at, r.ordering.as_ref().map(|(_, p)| *p), r.index));
    let mut next = 0;
    while next < rows.len() {
        let due = rows[next].enqueue_at;
        if let Some(wait) = due.checked_sub(epoch.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let mut batch = Vec::new();
        while next < rows.len() && rows[next].enqueue_at <= epoch.elapsed() && batch.len() < 5 {
            batch.push(rows[next]);
            next += 1;
        }
        let mut tries = 0;
        loop {
            match enqueue_batch(&pool, &batch).await {
                Ok(()) => break,
                Err(_) if tries < 300 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).context("enqueueing (Postgres did not come back)"),
            }
        }
    }
    Ok(())
}

async fn enqueue_batch(pool: &Pool, batch: &[&RowPlan]) -> Result<()> {
    let mut messages = Vec::new();
    for row in batch.iter().filter(|r| !r.undecodable) {
        let payload = serde_json::json!({
            "event_type": "soak.row",
            "data": {"row": row.index, "ordering_key": row.ordering.as_ref().map(|(k, _)| k)},
        });
        let mut message = OutboxMessage::new(row.destination, &payload)?
            .with_downstream_key(plan::downstream_key(row.index));
        if let Some((key, _)) = &row.ordering {
            message = message.with_ordering_key(key.clone());
        }
        messages.push(message);
    }
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    txoutbox::enqueue(&tx, &messages).await?;
    for row in batch.iter().filter(|r| r.undecodable) {
        let id = uuid::Uuid::now_v7();
        let payload = undecodable_payload(row.index);
        let key = plan::downstream_key(row.index);
        tx.execute(INSERT_UNDECODABLE, &[&id, &row.destination, &payload, &key])
            .await?;
    }
    txoutbox::relay::notify_in_transaction(&tx).await?;
    tx.commit().await?;
    Ok(())
}
