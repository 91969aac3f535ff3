//! Reading counts from the database, at once or while a relay works in the background: typed
//! [`Counts`] of where the rows are, [`wait_until`] a state is reached, the attempt log of one row
//! ([`assert_outcomes`]) and where one row is ([`status`]).

use std::time::{Duration, Instant};

use anyhow::Result;
use tokio_postgres::Client;
use txoutbox::admin::{AttemptOutcome, MessageStatus};

/// `SELECT count(*) FROM table_or_query` for a table name, or the query itself when it is one
/// (any text with a space: `SELECT count(*) FROM txoutbox_messages WHERE status = 'failed'`).
pub async fn count(client: &Client, table_or_query: &str) -> Result<i64> {
    let sql = if table_or_query.trim().contains(char::is_whitespace) {
        table_or_query.to_owned()
    } else {
        format!("SELECT count(*) FROM {table_or_query}")
    };
    Ok(client.query_one(&sql, &[]).await?.get(0))
}

/// Polls `sql` (one bigint, such as a `count(*)`) every 20 ms until it returns at least
/// `at_least` or `limit` passes; returns the last value, for the test to assert on.
pub async fn wait_for_count(
    client: &Client,
    sql: &str,
    at_least: i64,
    limit: Duration,
) -> Result<i64> {
    let start = Instant::now();
    loop {
        let n: i64 = client.query_one(sql, &[]).await?.get(0);
        if n >= at_least || start.elapsed() > limit {
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `sql` every 20 ms until it returns exactly `want` (a count falling to 0 too); an error
/// naming the last value when `limit` passes first.
pub async fn wait_for_exact_count(
    client: &Client,
    sql: &str,
    want: i64,
    limit: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let n: i64 = client.query_one(sql, &[]).await?.get(0);
        if n == want {
            return Ok(());
        }
        anyhow::ensure!(start.elapsed() < limit, "{sql} is {n}, not {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Where the outbox's rows are, read in one statement: the hot table by status, the delivered
/// history, the discarded rows, the attempt log (`txoutbox_attempts`, a delivered row's own
/// attempt included) and the idempotency keys. Compare whole values
/// (`assert_eq!(counts, Counts { delivered: 3, attempts: 5, ..Counts::default() })`) or fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Hot rows waiting for a claim (due or not).
    pub pending: i64,
    /// Hot rows under a relay's lease.
    pub in_flight: i64,
    /// Dead-lettered rows.
    pub failed: i64,
    /// At-most-once rows whose call's outcome is not known.
    pub unknown: i64,
    /// Rows in the delivered history.
    pub delivered: i64,
    /// Rows an operator discarded.
    pub discarded: i64,
    /// Entries of the attempt log.
    pub attempts: i64,
    /// Idempotency keys (all of them, whatever the destination filter).
    pub keys: i64,
}

impl Counts {
    /// Rows still in the hot table, whatever their status.
    pub fn hot(&self) -> i64 {
        self.pending + self.in_flight + self.failed + self.unknown
    }
}

/// Every count of [`Counts`], over every destination.
pub async fn counts(client: &Client) -> Result<Counts> {
    read_counts(client, None).await
}

/// [`Counts`] of one destination's rows (the keys are counted whole).
pub async fn counts_for(client: &Client, destination: &str) -> Result<Counts> {
    read_counts(client, Some(destination)).await
}

async fn read_counts(client: &Client, destination: Option<&str>) -> Result<Counts> {
    let row = client
        .query_one(
            "SELECT \
               (SELECT count(*) FROM txoutbox_messages WHERE status = 'pending' \
                  AND ($1::text IS NULL OR destination = $1)), \
               (SELECT count(*) FROM txoutbox_messages WHERE status = 'in_flight' \
                  AND ($1::text IS NULL OR destination = $1)), \
               (SELECT count(*) FROM txoutbox_messages WHERE status = 'failed' \
                  AND ($1::text IS NULL OR destination = $1)), \
               (SELECT count(*) FROM txoutbox_messages WHERE status = 'unknown' \
                  AND ($1::text IS NULL OR destination = $1)), \
               (SELECT count(*) FROM txoutbox_delivered WHERE $1::text IS NULL OR destination = $1), \
               (SELECT count(*) FROM txoutbox_discarded WHERE $1::text IS NULL OR destination = $1), \
               (SELECT count(*) FROM txoutbox_attempts WHERE $1::text IS NULL OR destination = $1), \
               (SELECT count(*) FROM txoutbox_idempotency_keys)",
            &[&destination],
        )
        .await?;
    Ok(Counts {
        pending: row.get(0),
        in_flight: row.get(1),
        failed: row.get(2),
        unknown: row.get(3),
        delivered: row.get(4),
        discarded: row.get(5),
        attempts: row.get(6),
        keys: row.get(7),
    })
}

/// How long [`wait_until`] waits before it fails.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Reads [`counts`] every 20 ms until `done` holds, and returns them; fails naming the last
/// counts when [`WAIT_LIMIT`] passes first. Waits by meaning (`|c| c.delivered == 3`), not by a
/// sleep: the test goes on as soon as the state is reached.
pub async fn wait_until(client: &Client, done: impl Fn(&Counts) -> bool) -> Result<Counts> {
    wait_until_within(client, WAIT_LIMIT, done).await
}

/// [`wait_until`] with a limit of the test's own.
pub async fn wait_until_within(
    client: &Client,
    limit: Duration,
    done: impl Fn(&Counts) -> bool,
) -> Result<Counts> {
    let start = Instant::now();
    loop {
        let now = counts(client).await?;
        if done(&now) {
            return Ok(now);
        }
        anyhow::ensure!(
            start.elapsed() < limit,
            "the awaited counts were not reached in {limit:?}; the last counts: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The attempt log of the row with `downstream_key`, oldest first: each attempt's and action's
/// outcome (`retry`, `delivered`, `replayed`, …), a delivered row's own attempt included.
pub async fn outcomes(client: &Client, downstream_key: &str) -> Result<Vec<AttemptOutcome>> {
    let rows = client
        .query(
            "SELECT outcome FROM txoutbox_attempts WHERE downstream_key = $1 \
             ORDER BY finished_at, attempt",
            &[&downstream_key],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let text: String = r.get(0);
            text.parse::<AttemptOutcome>()
                .map_err(|e| anyhow::anyhow!("outcome {text:?} of {downstream_key}: {e}"))
        })
        .collect()
}

/// Fails, naming both lists, unless the attempt log of `downstream_key` reads `want`, in order.
pub async fn assert_outcomes(
    client: &Client,
    downstream_key: &str,
    want: impl IntoIterator<Item = AttemptOutcome>,
) -> Result<()> {
    let want: Vec<AttemptOutcome> = want.into_iter().collect();
    let got = outcomes(client, downstream_key).await?;
    anyhow::ensure!(
        got == want,
        "the attempt log of {downstream_key} reads {got:?}, not {want:?}"
    );
    Ok(())
}

/// Where the row with `downstream_key` is now: its hot status, `delivered` or `discarded`; `None`
/// when no table holds it.
pub async fn status(client: &Client, downstream_key: &str) -> Result<Option<MessageStatus>> {
    status_by(client, "downstream_key", &downstream_key, downstream_key).await
}

/// The status of the row whose `column` (`id` or `downstream_key`) is `value`, in whichever table
/// holds it; `name` names the row in an error.
pub(crate) async fn status_by(
    client: &Client,
    column: &str,
    value: &(dyn tokio_postgres::types::ToSql + Sync),
    name: &str,
) -> Result<Option<MessageStatus>> {
    let sql = format!(
        "SELECT status FROM txoutbox_messages WHERE {column} = $1 \
         UNION ALL SELECT 'delivered' FROM txoutbox_delivered WHERE {column} = $1 \
         UNION ALL SELECT 'discarded' FROM txoutbox_discarded WHERE {column} = $1 \
         LIMIT 1"
    );
    let row = client.query_opt(&sql, &[value]).await?;
    row.map(|r| {
        let text: String = r.get(0);
        text.parse::<MessageStatus>()
            .map_err(|e| anyhow::anyhow!("status {text:?} of {name}: {e}"))
    })
    .transpose()
}
