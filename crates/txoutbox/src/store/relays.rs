//! `txoutbox_relays`: each running relay's row (who it is, its heartbeat, its last claim, what it
//! holds, its sinks and bounds), written by the relay and read by the operator's `relays` view.
//! A relay is alive while its heartbeat is less than three of its own intervals old.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use super::{Result, TxExecutor};
use crate::admin::{AdminError, RelayRecord};

/// Records relay $1 (host $2, pid $3, version $4, heartbeat every $5 seconds, last claim $6,
/// holding $7 rows, sinks $8, bounds $9), or refreshes its row. A row of the same owner from
/// another process (an owner name reused after a restart) starts again; the same process
/// registering again (its row was pruned while it could not reach the database) keeps its start.
const REGISTER: &str = "INSERT INTO txoutbox_relays AS r (owner, host, pid, version, \
         heartbeat_every, last_claim_at, held, sinks, flow) \
     VALUES ($1, $2, $3, $4, make_interval(secs => $5), $6, $7, $8, $9) \
     ON CONFLICT (owner) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, \
         version = EXCLUDED.version, heartbeat_at = now(), \
         heartbeat_every = EXCLUDED.heartbeat_every, last_claim_at = EXCLUDED.last_claim_at, \
         held = EXCLUDED.held, sinks = EXCLUDED.sinks, flow = EXCLUDED.flow, \
         started_at = CASE WHEN r.host = EXCLUDED.host AND r.pid = EXCLUDED.pid \
             THEN r.started_at ELSE now() END";

/// The heartbeat of relay $1: its last claim $2 (NULL: unchanged) and the rows it holds $3.
/// Returns the relays alive (this one and those whose heartbeat is under three of their
/// intervals old); no row when this relay's row is gone (pruned, deleted by hand).
const HEARTBEAT: &str = "UPDATE txoutbox_relays SET heartbeat_at = now(), \
         last_claim_at = COALESCE($2, last_claim_at), held = $3 \
     WHERE owner = $1 \
     RETURNING 1 + (SELECT count(*) FROM txoutbox_relays o \
         WHERE o.owner <> $1 AND o.heartbeat_at > now() - 3 * o.heartbeat_every)";

/// A clean exit: relay $1's row goes.
const REMOVE: &str = "DELETE FROM txoutbox_relays WHERE owner = $1";

/// Relays silent for a day past their staleness: no process is left to remove their rows.
const PRUNE: &str = "DELETE FROM txoutbox_relays \
     WHERE heartbeat_at < now() - interval '24 hours' - 3 * heartbeat_every";

/// Every relay's row, alive ones first, with its staleness and ages by the database's clock.
const LIST: &str = "SELECT owner, host, pid, version, started_at, heartbeat_at, \
         EXTRACT(EPOCH FROM heartbeat_every)::float8, last_claim_at, held, sinks, flow, \
         heartbeat_at <= now() - 3 * heartbeat_every AS stale, \
         greatest(EXTRACT(EPOCH FROM now() - started_at), 0)::float8, \
         greatest(EXTRACT(EPOCH FROM now() - heartbeat_at), 0)::float8, \
         greatest(EXTRACT(EPOCH FROM now() - last_claim_at), 0)::float8 \
     FROM txoutbox_relays ORDER BY stale, host, started_at, owner";

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
    conn.rows(
        REGISTER,
        &[
            (&r.owner, Type::TEXT),
            (&r.host, Type::TEXT),
            (&r.pid, Type::INT4),
            (&r.version, Type::TEXT),
            (&r.heartbeat_secs, Type::FLOAT8),
            (&r.last_claim, Type::TIMESTAMPTZ),
            (&r.held, Type::INT4),
            (&r.sinks, Type::TEXT_ARRAY),
            (r.flow, Type::JSONB),
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
    let rows = conn
        .rows(
            HEARTBEAT,
            &[
                (&owner, Type::TEXT),
                (&last_claim, Type::TIMESTAMPTZ),
                (&held, Type::INT4),
            ],
        )
        .await?;
    rows.first().map(|row| row.try_get(0)).transpose()
}

/// Removes the relay's row ([`REMOVE`]).
pub(crate) async fn remove(conn: &impl TxExecutor, owner: &str) -> Result<()> {
    conn.rows(REMOVE, &[(&owner, Type::TEXT)]).await?;
    Ok(())
}

/// Deletes the rows of relays silent for a day ([`PRUNE`]).
pub(crate) async fn prune(conn: &impl TxExecutor) -> Result<()> {
    conn.rows(PRUNE, &[]).await?;
    Ok(())
}

/// Every relay's row ([`LIST`]). A row another program wrote with values out of range (a
/// negative count, NULL sink names) is shown as near as it can be, never refused.
pub(crate) async fn list(
    client: &impl GenericClient,
) -> std::result::Result<Vec<RelayRecord>, AdminError> {
    client
        .query_typed(LIST, &[])
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
