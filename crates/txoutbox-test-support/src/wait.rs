//! Waits for a condition a test names (a sink's calls all ended, every other session of the
//! database closed), polled every 10 ms for up to [`WAIT_LIMIT`]: the test goes on as soon as
//! the condition holds, and fails naming it when it never does.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio_postgres::Client;

use crate::WAIT_LIMIT;

const POLL: Duration = Duration::from_millis(10);

/// Waits until `check` holds; fails naming `what` after [`WAIT_LIMIT`].
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) -> Result<()> {
    eventually_async(what, || std::future::ready(Ok(check()))).await
}

/// [`eventually`] for a check that reads the database (or anything else asynchronous).
pub async fn eventually_async<F, Fut>(what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    eventually_some(what, || {
        let checked = check();
        async move { Ok(checked.await?.then_some(())) }
    })
    .await
}

/// Polls `probe` every 10 ms until it answers `Some`, and returns that; fails naming `what` when
/// [`WAIT_LIMIT`] passes first. For a signal that is not a count: a receiver's records, a
/// program's output, a server that answers.
pub async fn eventually_some<T, F, Fut>(what: &str, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    loop {
        if let Some(found) = probe().await? {
            return Ok(found);
        }
        anyhow::ensure!(
            start.elapsed() < WAIT_LIMIT,
            "not reached in {WAIT_LIMIT:?}: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `client` is the only session of its database: every other connection (a stopped
/// relay's pool) has closed. A backend reports its statistics before it leaves
/// `pg_stat_activity`, and a statement it was running has committed or rolled back.
pub async fn other_sessions_ended(client: &Client) -> Result<()> {
    eventually_async("every other session of the database has ended", || async {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await?
            .get(0);
        Ok(n == 0)
    })
    .await
}

/// Pending rows of `destination` that are due now (`next_attempt_at <= now()`): what the next
/// claim may take, parked rows and rows waiting for a retry left out.
pub async fn due(client: &Client, destination: &str) -> Result<i64> {
    Ok(client
        .query_one(
            "SELECT count(*) FROM txoutbox_messages WHERE status = 'pending' \
             AND destination = $1 AND next_attempt_at <= now()",
            &[&destination],
        )
        .await?
        .get(0))
}

/// Rows leased by the relay `owner` now.
pub async fn leased_by(client: &Client, owner: &str) -> Result<i64> {
    Ok(client
        .query_one(
            "SELECT count(*) FROM txoutbox_messages WHERE status = 'in_flight' \
             AND lease_owner = $1",
            &[&owner],
        )
        .await?
        .get(0))
}

/// Waits until every idempotency key of `scope` is past its window by the database's clock
/// (`expires_at <= now()`): what a key's window of a few milliseconds needs before the test
/// goes on, without a sleep.
pub async fn keys_expired(client: &Client, scope: &txoutbox::Scope) -> Result<()> {
    let what = format!("every key of scope {:?} has expired", scope.name());
    eventually_async(&what, || async {
        let expired: Option<bool> = client
            .query_one(
                "SELECT bool_and(expires_at <= now()) FROM txoutbox_idempotency_keys \
                 WHERE scope = $1",
                &[&scope.name()],
            )
            .await?
            .get(0);
        Ok(expired == Some(true))
    })
    .await
}

/// The idempotency keys that carry deferred effects not fanned out yet (`scope`, `key`), in
/// order.
pub async fn keys_with_effects(client: &Client) -> Result<Vec<(String, String)>> {
    Ok(client
        .query(
            "SELECT scope, key FROM txoutbox_idempotency_keys WHERE effects IS NOT NULL \
             ORDER BY scope, key",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}
