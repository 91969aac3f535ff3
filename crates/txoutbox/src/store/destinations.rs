//! `txoutbox_destinations`, flow control per destination: the rate limits a relay registers and
//! the breaker columns its outcomes feed back. (The claim reads and spends these rows in its own
//! statement, in `messages`.)

use super::statements::destinations::{
    ENSURE as ENSURE_DESTINATIONS, LOCK as LOCK_DESTINATIONS, REGISTER as REGISTER_DESTINATIONS,
    UPDATE_BREAKERS,
};
use chrono::{DateTime, Utc};

use super::{Result, Run, TxExecutor};

/// Records the rate limits (`rates`, `bursts`; `None`: no limit) of `destinations` and gives
/// each its row.
pub(crate) async fn register_destinations(
    conn: &impl TxExecutor,
    destinations: &[&String],
    rates: &[Option<f64>],
    bursts: &[Option<f64>],
) -> Result<()> {
    conn.run(REGISTER_DESTINATIONS, &[&destinations, &rates, &bursts])
        .await?;
    Ok(())
}

/// Gives `destinations` their row if they have none.
pub(crate) async fn ensure_destinations(
    conn: &impl TxExecutor,
    destinations: &[&str],
) -> Result<()> {
    conn.run(ENSURE_DESTINATIONS, &[&destinations]).await?;
    Ok(())
}

/// A destination's breaker and throttle columns (their transitions are the relay's:
/// `relay/flow/shared.rs`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BreakerColumns {
    /// `closed`, `open` or `half_open` (any other value is read as `closed`).
    pub breaker: &'static str,
    pub failures: i32,
    pub opens: i32,
    pub open_until: Option<DateTime<Utc>>,
    pub open_reason: Option<String>,
    pub probe_until: Option<DateTime<Utc>>,
    /// No call until then: the downstream throttled (Retry-After).
    pub throttled_until: Option<DateTime<Utc>>,
    pub throttle_reason: Option<String>,
}

/// A destination's row: its name and its breaker and throttle columns.
#[derive(Debug, Clone)]
pub(crate) struct BreakerRow {
    pub destination: String,
    pub columns: BreakerColumns,
}

/// Locks the breaker columns of `destinations` (in the caller's transaction) and reads them,
/// each with the database's `now()`.
pub(crate) async fn lock_breakers(
    tx: &impl TxExecutor,
    destinations: &[&str],
) -> Result<Vec<(BreakerRow, DateTime<Utc>)>> {
    let rows = tx.run(LOCK_DESTINATIONS, &[&destinations]).await?;
    let mut breakers = Vec::with_capacity(rows.len());
    for row in &rows {
        let row_now = row.try_get("now")?;
        let breaker = BreakerRow {
            destination: row.try_get("destination")?,
            columns: BreakerColumns {
                breaker: match row.try_get::<_, &str>("breaker")? {
                    "open" => "open",
                    "half_open" => "half_open",
                    _ => "closed",
                },
                failures: row.try_get("failures")?,
                opens: row.try_get("opens")?,
                open_until: row.try_get("open_until")?,
                open_reason: row.try_get("open_reason")?,
                probe_until: row.try_get("probe_until")?,
                throttled_until: row.try_get("throttled_until")?,
                throttle_reason: row.try_get("throttle_reason")?,
            },
        };
        breakers.push((breaker, row_now));
    }
    Ok(breakers)
}

/// Writes the breaker columns of destinations locked by [`lock_breakers`].
pub(crate) async fn update_breakers(tx: &impl TxExecutor, updated: &[BreakerRow]) -> Result<()> {
    let names: Vec<&str> = updated.iter().map(|s| s.destination.as_str()).collect();
    let columns = || updated.iter().map(|s| &s.columns);
    let breakers: Vec<&str> = columns().map(|c| c.breaker).collect();
    let failures: Vec<i32> = columns().map(|c| c.failures).collect();
    let opens: Vec<i32> = columns().map(|c| c.opens).collect();
    let open_until: Vec<Option<DateTime<Utc>>> = columns().map(|c| c.open_until).collect();
    let reasons: Vec<Option<&str>> = columns().map(|c| c.open_reason.as_deref()).collect();
    let probe_until: Vec<Option<DateTime<Utc>>> = columns().map(|c| c.probe_until).collect();
    let throttled_until: Vec<Option<DateTime<Utc>>> =
        columns().map(|c| c.throttled_until).collect();
    let throttle_reasons: Vec<Option<&str>> =
        columns().map(|c| c.throttle_reason.as_deref()).collect();
    tx.run(
        UPDATE_BREAKERS,
        &[
            &names,
            &breakers,
            &failures,
            &opens,
            &open_until,
            &reasons,
            &probe_until,
            &throttled_until,
            &throttle_reasons,
        ],
    )
    .await?;
    Ok(())
}
