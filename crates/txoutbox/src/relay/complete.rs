//! The completer: writes attempt outcomes in batches, fenced by lease tokens. Rows of
//! destinations with a completion hook are written one by one with their hook, on tasks of their
//! own, so a slow hook holds only its own rows.
//!
//! A completion the database refuses for a data reason (SQLSTATE classes 22, 23, 54) is never
//! retried as it is: the batch is split, and a row that still fails alone is written once more
//! without its downstream's text. One poisoned row cannot hold the others' outcomes.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use uuid::Uuid;

use super::{storable, Finished, Held, Inner, Outcome};
use crate::error::{Error, Result};
use crate::store::{self, Pooled, TxExecutor};

/// Completion statements in flight at once (each on its own pooled connection).
const COMPLETION_WRITERS: usize = 2;

/// Hooked completions in flight at once (each a transaction of its own).
const HOOK_WRITERS: usize = 2;

/// Writes outcomes until `results` closes. Retries a write that failed for want of the database
/// until it succeeds (the rows stay leased meanwhile) or, after shutdown, gives up after a few
/// tries: the leases then expire and the rows are delivered again with the same key.
pub(super) async fn completer(
    inner: Arc<Inner>,
    mut results: mpsc::Receiver<Finished>,
    shutting_down: Arc<AtomicBool>,
    held: Held,
) {
    let max = inner.config.completion_batch.max(1);
    let writers = Arc::new(Semaphore::new(COMPLETION_WRITERS));
    let hook_writers = Arc::new(Semaphore::new(HOOK_WRITERS));
    let mut writes = JoinSet::new();
    while let Some(first) = results.recv().await {
        // Wait for a writer before gathering the batch: while both write, outcomes pile up in
        // the channel and the next batch takes them all, so batches grow with the load.
        let Ok(permit) = writers.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max {
            match results.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        // The breakers learn a batch's outcomes before its rows are completed: a completed row
        // frees its destination's in-flight slot, and the claim that fills the slot must see
        // the breaker these outcomes may have opened.
        let signals = super::flow::signals(&inner, &batch);
        let learned = {
            let inner = inner.clone();
            async move {
                if !signals.is_empty() {
                    if let Err(e) = super::flow::feedback(&inner, &signals).await {
                        tracing::warn!(error = %e, "could not record the outcomes for the destinations' breakers");
                    }
                }
            }
            .boxed()
            .shared()
        };
        let (hooked, plain): (Vec<_>, Vec<_>) = batch.into_iter().partition(|f| {
            f.completion.is_some() && inner.hooks.contains_key(&f.lease.delivery.destination)
        });
        for finished in hooked {
            let Ok(permit) = hook_writers.clone().acquire_owned().await else {
                return;
            };
            let (inner, shutting_down, held) = (inner.clone(), shutting_down.clone(), held.clone());
            let learned = learned.clone();
            writes.spawn(async move {
                learned.await;
                write_hooked(&inner, &finished, &shutting_down).await;
                held.forget(std::slice::from_ref(&finished));
                inner
                    .config
                    .events
                    .emit(super::RelayEvent::Completed { n: 1 });
                drop(permit);
            });
        }
        if !plain.is_empty() {
            // Batches touch disjoint rows: up to COMPLETION_WRITERS of them are written at once.
            let (inner, shutting_down, held) = (inner.clone(), shutting_down.clone(), held.clone());
            writes.spawn(async move {
                learned.await;
                write_plain(&inner, &plain, &shutting_down).await;
                held.forget(&plain);
                inner
                    .config
                    .events
                    .emit(super::RelayEvent::Completed { n: plain.len() });
                drop(permit);
            });
        }
        while writes.try_join_next().is_some() {}
    }
    while writes.join_next().await.is_some() {}
}

/// How a write ended.
enum Write {
    /// Written.
    Done,
    /// Not written: the database stayed away past the shutdown.
    GaveUp,
    /// Refused for a data reason (the SQLSTATE): trying the same again cannot help.
    Refused(String),
}

async fn write_retrying<F, Fut>(shutting_down: &AtomicBool, mut write: F) -> Write
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut tries = 0u32;
    loop {
        match write().await {
            Ok(()) => return Write::Done,
            Err(e) => {
                if let Some(code) = refused(&e) {
                    tracing::warn!(error = %e, "completion refused by the database");
                    return Write::Refused(code);
                }
                tries += 1;
                if shutting_down.load(Ordering::Relaxed) && tries >= 5 {
                    tracing::error!(error = %e, "completion not written; the leases will expire and the rows be delivered again");
                    return Write::GaveUp;
                }
                tracing::warn!(error = %e, tries, "completion not written yet; retrying");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(tries.min(20)))).await;
            }
        }
    }
}

/// The SQLSTATE of an error that says the statement's data is at fault (data exceptions,
/// integrity violations, program limits), not the connection or the server.
pub(super) fn refused(error: &Error) -> Option<String> {
    let Error::Database(e) = error else {
        return None;
    };
    let code = e.as_db_error()?.code().code();
    matches!(code.get(..2), Some("22" | "23" | "54")).then(|| code.to_owned())
}

/// Writes a batch; a batch refused for a data reason is written row by row, and a row refused
/// alone once more without its text.
async fn write_plain(inner: &Inner, batch: &[Finished], shutting_down: &AtomicBool) {
    let Write::Refused(code) = write_retrying(shutting_down, || complete_plain(inner, batch)).await
    else {
        return;
    };
    if batch.len() == 1 {
        return write_plain_without_text(inner, &batch[0], &code, shutting_down).await;
    }
    for finished in batch {
        let one = std::slice::from_ref(finished);
        if let Write::Refused(code) =
            write_retrying(shutting_down, || complete_plain(inner, one)).await
        {
            write_plain_without_text(inner, finished, &code, shutting_down).await;
        }
    }
}

async fn write_plain_without_text(
    inner: &Inner,
    finished: &Finished,
    code: &str,
    shutting_down: &AtomicBool,
) {
    let plain = without_text(finished, code);
    let one = std::slice::from_ref(&plain);
    if let Write::Refused(code) = write_retrying(shutting_down, || complete_plain(inner, one)).await
    {
        tracing::error!(message_id = %finished.lease.delivery.id, sqlstate = %code, "the outcome cannot be written; the lease will expire and the row be delivered again");
    }
}

/// The same outcome without the downstream's text (error and receipt), which is what a data
/// error in a completion can come from.
fn without_text(finished: &Finished, code: &str) -> Finished {
    Finished {
        error: Some(format!(
            "the {} outcome's text could not be stored (SQLSTATE {code})",
            finished.outcome.as_str()
        )),
        receipt: None,
        ..finished.clone()
    }
}

/// Completes a batch on a pooled connection: one statement, or, when the batch delivers rows
/// with ordering keys, a transaction that first takes those keys' enqueue locks
/// ([`delivered_ordering_keys`]).
async fn complete_plain(inner: &Inner, batch: &[Finished]) -> Result<()> {
    let mut client = inner.pool.get().await?;
    let keys = delivered_ordering_keys(batch);
    let fenced = if keys.is_empty() {
        None
    } else {
        complete_fenced(&mut client, inner, batch, &keys).await?
    };
    let applied = match fenced {
        Some(applied) => applied,
        None => {
            let conn = Pooled::new(&client, inner.config.prepared_statements);
            run_complete(&conn, inner, batch).await?
        }
    };
    record_outcomes(inner, &applied, batch.iter());
    Ok(())
}

/// Completes a batch in a transaction that holds the enqueue locks of `keys` first; `None`
/// (the transaction rolled back) when one was not had within the relay's `ordering_lock_wait`
/// (200 ms by default): an enqueue transaction
/// holds one for long, or waits for one this completion holds. The caller then completes
/// without the fence; a row that enqueue writes waiting behind a row delivered here is made due
/// by the relay's sweep (`messages/unpark_stranded.sql`).
async fn complete_fenced(
    client: &mut deadpool_postgres::Object,
    inner: &Inner,
    batch: &[Finished],
    keys: &[&str],
) -> Result<Option<Vec<Uuid>>> {
    let tx = client.transaction().await?;
    let conn = Pooled::new(&tx, inner.config.prepared_statements);
    let completed = match fence(&conn, inner, keys).await {
        Ok(true) => run_complete(&conn, inner, batch).await.map(Some),
        other => other.map(|_| None),
    };
    match completed {
        Ok(Some(applied)) => {
            tx.commit().await?;
            Ok(Some(applied))
        }
        Err(e) if !lock_not_available(&e) => Err(e),
        _ => {
            tx.rollback().await?;
            tracing::debug!("ordering keys held by an enqueue; completing without its fence");
            Ok(None)
        }
    }
}

/// Takes the enqueue locks of `keys` in the transaction of `conn`, waiting at most the relay's
/// `ordering_lock_wait` for each; false when one was not had in time (the transaction is then
/// aborted: roll it back).
async fn fence(conn: &impl TxExecutor, inner: &Inner, keys: &[&str]) -> Result<bool> {
    let wait = inner.config.ordering_lock_wait;
    match store::messages::lock_ordering_keys_briefly(conn, keys, wait).await {
        Ok(()) => Ok(true),
        Err(e) => {
            let e = Error::from(e);
            if lock_not_available(&e) {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// A lock wait cut off by `lock_timeout` (SQLSTATE 55P03).
fn lock_not_available(error: &Error) -> bool {
    let Error::Database(e) = error else {
        return false;
    };
    e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

/// The ordering keys of the rows a batch delivers. Their completion makes the next row of each
/// key due, and an enqueue of the key that has not committed yet wrote its row waiting behind
/// the row delivered (it still saw it) while the completion cannot see that row: the completion
/// first takes the keys' enqueue locks (`messages/lock_ordering_keys.sql`), in a statement of its
/// own, so that the completion statement's snapshot, taken once the locks are held, sees every
/// enqueue of those keys that saw the row still there.
fn delivered_ordering_keys(batch: &[Finished]) -> Vec<&str> {
    batch
        .iter()
        .filter(|f| matches!(f.outcome, Outcome::Delivered))
        .filter_map(|f| f.lease.delivery.ordering_key.as_deref())
        .collect()
}

/// Writes one hooked outcome with its hook. A hook that fails turns the attempt into a retry
/// (logged with the downstream's receipt), so the row is delivered again with the same key and
/// the hook runs again; on the last attempt the row is dead-lettered instead.
async fn write_hooked(inner: &Inner, finished: &Finished, shutting_down: &AtomicBool) {
    let Write::Refused(code) =
        write_retrying(shutting_down, || complete_hooked(inner, finished)).await
    else {
        return;
    };
    let mut retry = without_text(finished, &code);
    retry.completion = None;
    retry.outcome = Outcome::Retry;
    retry.delay = inner
        .policy(&finished.lease.delivery.destination)
        .retry
        .delay(finished.lease.delivery.attempt, None);
    write_plain(inner, std::slice::from_ref(&retry), shutting_down).await;
}

async fn complete_hooked(inner: &Inner, finished: &Finished) -> Result<()> {
    let mut client = inner.pool.get().await?;
    let tx = client.transaction().await?;
    let prepared = inner.config.prepared_statements;
    let keys = delivered_ordering_keys(std::slice::from_ref(finished));
    let tx = if keys.is_empty() || fence(&Pooled::new(&tx, prepared), inner, &keys).await? {
        tx
    } else {
        tx.rollback().await?;
        client.transaction().await?
    };
    let applied = run_complete(
        &Pooled::new(&tx, prepared),
        inner,
        std::slice::from_ref(finished),
    )
    .await?;
    if let (Some(hook), Some(completion), false) = (
        inner.hooks.get(&finished.lease.delivery.destination),
        &finished.completion,
        applied.is_empty(),
    ) {
        if let Err(e) = hook
            .completed(&tx, &finished.lease.delivery, completion)
            .await
        {
            tx.rollback().await?;
            tracing::error!(error = %e, message_id = %finished.lease.delivery.id, "completion hook failed; the row will be delivered again");
            let failed = hook_failed(inner, finished, &*e);
            let applied = run_complete(
                &Pooled::new(&client, prepared),
                inner,
                std::slice::from_ref(&failed),
            )
            .await?;
            record_outcomes(inner, &applied, std::iter::once(&failed));
            return Ok(());
        }
    }
    tx.commit().await?;
    record_outcomes(inner, &applied, std::iter::once(finished));
    Ok(())
}

/// The outcome of an attempt whose completion hook failed: a retry that keeps the receipt in
/// the attempt log, or on the last attempt a dead letter.
fn hook_failed(inner: &Inner, finished: &Finished, error: &dyn std::error::Error) -> Finished {
    let attempt = finished.lease.delivery.attempt;
    let retry = &inner.policy(&finished.lease.delivery.destination).retry;
    let text = format!(
        "the completion hook failed after the {} outcome: {}",
        finished.outcome.as_str(),
        crate::sink::error_chain(error)
    );
    let (outcome, delay) = if attempt >= retry.max_attempts {
        (Outcome::Failed, Duration::ZERO)
    } else {
        (Outcome::Retry, retry.delay(attempt, None))
    };
    Finished {
        outcome,
        delay,
        error: Some(storable(text)),
        completion: None,
        ..finished.clone()
    }
}

/// Counts the outcomes whose completion took effect (`applied`): a completion fenced out by a
/// lost lease is not a delivery of this relay's. Wakes the claimer when a delivered row had an
/// ordering key: the next row of its key became claimable.
fn record_outcomes<'a>(
    inner: &Inner,
    applied: &[Uuid],
    finished: impl Iterator<Item = &'a Finished>,
) {
    use crate::telemetry::{DEAD_LETTERED, DELIVERED, DELIVERY_LATENCY, RETRIED};
    let mut ordered = false;
    for f in finished.filter(|f| applied.contains(&f.lease.delivery.id)) {
        let destination = f.lease.delivery.destination.clone();
        match f.outcome {
            Outcome::Delivered => {
                ordered |= f.lease.delivery.ordering_key.is_some();
                let latency = (f.finished - f.lease.delivery.created_at)
                    .to_std()
                    .unwrap_or_default();
                metrics::histogram!(DELIVERY_LATENCY, "destination" => destination.clone())
                    .record(latency.as_secs_f64());
                metrics::counter!(DELIVERED, "destination" => destination).increment(1);
            }
            Outcome::Retry => metrics::counter!(RETRIED, "destination" => destination).increment(1),
            Outcome::Failed => {
                metrics::counter!(DEAD_LETTERED, "destination" => destination).increment(1)
            }
            Outcome::Unknown | Outcome::Released | Outcome::Unstarted => {}
        }
    }
    if ordered {
        inner.wake.notify_one();
    }
}

async fn run_complete(
    conn: &impl TxExecutor,
    inner: &Inner,
    batch: &[Finished],
) -> Result<Vec<Uuid>> {
    let attempts: Vec<store::attempts::FinishedAttempt> = batch
        .iter()
        .map(|f| store::attempts::FinishedAttempt {
            id: f.lease.delivery.id,
            token: f.lease.token,
            kind: f.outcome.as_str(),
            error: f.error.as_deref(),
            receipt: f.receipt.as_deref(),
            delay_secs: f.delay.as_secs_f64(),
            started: f.lease.started,
            finished: f.finished,
            attempt: i32::try_from(f.lease.delivery.attempt).unwrap_or(i32::MAX),
            downstream_key: &f.lease.delivery.downstream_key,
            destination: &f.lease.delivery.destination,
        })
        .collect();
    Ok(store::attempts::complete_attempts(conn, &inner.config.owner, &attempts).await?)
}
