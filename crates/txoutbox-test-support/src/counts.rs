//! Reading counts from the database, at once or while a relay works in the background.

use std::time::{Duration, Instant};

use anyhow::Result;
use tokio_postgres::Client;

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
