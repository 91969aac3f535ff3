//! Waiting on the database for an outcome a relay produces in the background.

use std::time::{Duration, Instant};

use anyhow::Result;
use tokio_postgres::Client;

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
