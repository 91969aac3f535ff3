//! `txoutbox_attempt_log`, the attempt log: the relay's completion of a batch of attempts, which
//! moves delivered rows from `txoutbox_messages` to `txoutbox_delivered` (each carrying its
//! delivering attempt), sends the others back to pending, `failed` or `unknown`, and logs those
//! other attempts, all in one statement. `txoutbox_attempts` is the view of both. (The
//! lease reclaim, mainly about the hot table, logs its attempts from `messages`.)

use super::statements::attempt_log::COMPLETE;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Result, Run, TxExecutor};

/// One attempt's outcome, to complete.
pub(crate) struct FinishedAttempt<'a> {
    pub id: Uuid,
    /// The lease token the attempt ran under (the fence).
    pub token: i64,
    /// The outcome, as the attempt log stores it (`delivered`, `retry`, `failed`, …).
    pub kind: &'a str,
    pub error: Option<&'a str>,
    pub receipt: Option<&'a str>,
    /// Until the next attempt, for a retry.
    pub delay_secs: f64,
    pub started: DateTime<Utc>,
    pub finished: DateTime<Utc>,
    pub attempt: i32,
    pub downstream_key: &'a str,
    pub destination: &'a str,
}

/// Completes a batch of attempts of relay `relay`, fenced by their lease tokens; returns the
/// ids whose completion took effect.
pub(crate) async fn complete_attempts(
    conn: &impl TxExecutor,
    relay: &str,
    batch: &[FinishedAttempt<'_>],
) -> Result<Vec<Uuid>> {
    let ids: Vec<Uuid> = batch.iter().map(|a| a.id).collect();
    let tokens: Vec<i64> = batch.iter().map(|a| a.token).collect();
    let kinds: Vec<&str> = batch.iter().map(|a| a.kind).collect();
    let errors: Vec<Option<&str>> = batch.iter().map(|a| a.error).collect();
    let receipts: Vec<Option<&str>> = batch.iter().map(|a| a.receipt).collect();
    let delays: Vec<f64> = batch.iter().map(|a| a.delay_secs).collect();
    let started: Vec<DateTime<Utc>> = batch.iter().map(|a| a.started).collect();
    let finished: Vec<DateTime<Utc>> = batch.iter().map(|a| a.finished).collect();
    let attempts: Vec<i32> = batch.iter().map(|a| a.attempt).collect();
    let keys: Vec<&str> = batch.iter().map(|a| a.downstream_key).collect();
    let destinations: Vec<&str> = batch.iter().map(|a| a.destination).collect();
    let rows = conn
        .run(
            COMPLETE,
            &[
                &ids,
                &tokens,
                &kinds,
                &errors,
                &receipts,
                &delays,
                &started,
                &finished,
                &attempts,
                &keys,
                &relay,
                &destinations,
            ],
        )
        .await?;
    rows.iter().map(|r| r.try_get(0)).collect()
}
