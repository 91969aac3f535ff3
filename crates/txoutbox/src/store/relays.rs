//! `txoutbox_relays`: each running relay's row (who it is, its heartbeat, its last claim, what it
//! holds, its sinks and bounds), written by the relay and read by the operator's `relays` view.
//! A relay is alive while its heartbeat is less than three of its own intervals old.

use super::statements::relays::{HEARTBEAT, LIST, PRUNE, REGISTER, REMOVE};
use chrono::{DateTime, Utc};
use tokio_postgres::GenericClient;

use super::{Result, Run, TxExecutor};
use crate::admin::{AdminError, RelayRecord};

/// What a relay records of itself.
pub(crate) struct Registration<'a> {
    pub owner: &'a str,
    pub host: &'a str,
    pub pid: i32,
    pub version: &'a str,
    pub heartbeat_secs: f64,
    pub last_claim: Option<DateTime<Utc>>,
    pub held: i32,
    pub sinks: &'a [&'a str],
    pub flow: &'a serde_json::Value,
}

/// Records the relay ([`REGISTER`]).
pub(crate) async fn register(conn: &impl TxExecutor, r: &Registration<'_>) -> Result<()> {
    conn.run(
        REGISTER,
        &[
            &r.owner,
            &r.host,
            &r.pid,
            &r.version,
            &r.heartbeat_secs,
            &r.last_claim,
            &r.held,
            &r.sinks,
            r.flow,
        ],
    )
    .await?;
    Ok(())
}

/// Beats ([`HEARTBEAT`]): the relays alive, or `None` when this relay's row is gone.
pub(crate) async fn heartbeat(
    conn: &impl TxExecutor,
    owner: &str,
    last_claim: Option<DateTime<Utc>>,
    held: i32,
) -> Result<Option<i64>> {
    let rows = conn.run(HEARTBEAT, &[&owner, &last_claim, &held]).await?;
    rows.first().map(|row| row.try_get(0)).transpose()
}

/// Removes the relay's row ([`REMOVE`]).
pub(crate) async fn remove(conn: &impl TxExecutor, owner: &str) -> Result<()> {
    conn.run(REMOVE, &[&owner]).await?;
    Ok(())
}

/// Deletes the rows of relays silent for a day ([`PRUNE`]).
pub(crate) async fn prune(conn: &impl TxExecutor) -> Result<()> {
    conn.run(PRUNE, &[]).await?;
    Ok(())
}

/// Every relay's row ([`LIST`]). A row another program wrote with values out of range (a
/// negative count, NULL sink names) is shown as near as it can be, never refused.
pub(crate) async fn list(
    client: &impl GenericClient,
) -> std::result::Result<Vec<RelayRecord>, AdminError> {
    client
        .query_typed(LIST.sql, &[])
        .await?
        .iter()
        .map(|r| {
            let sinks: Vec<Option<String>> = r.try_get(9)?;
            Ok(RelayRecord {
                owner: r.try_get(0)?,
                host: r.try_get(1)?,
                pid: r.try_get(2)?,
                version: r.try_get(3)?,
                started_at: r.try_get(4)?,
                heartbeat_at: r.try_get(5)?,
                heartbeat_every_secs: r.try_get(6)?,
                last_claim_at: r.try_get(7)?,
                held: u64::try_from(r.try_get::<_, i32>(8)?).unwrap_or(0),
                sinks: sinks.into_iter().flatten().collect(),
                flow: r.try_get(10)?,
                stale: r.try_get(11)?,
                started_age_secs: r.try_get(12)?,
                heartbeat_age_secs: r.try_get(13)?,
                last_claim_age_secs: r.try_get(14)?,
            })
        })
        .collect()
}
