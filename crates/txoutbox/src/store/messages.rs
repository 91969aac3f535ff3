//! `txoutbox_messages`, the hot outbox: the write path's insert and ordering-key locks; the
//! relay's claim, start mark, give-back and lease reclaim; the backlog sample. The literal
//! `status = 'pending'` in [`CLAIM`] and [`SAMPLE_BACKLOG`] matches the partial index
//! `txoutbox_messages_due`; keep it literal.

use super::statements::messages::{
    ANALYZE, CLAIM, CLAIM_UNBOUNDED, INSERT, INSERT_ORDERED, LOCK_ORDERING_KEYS,
    LOCK_ORDERING_KEYS_BRIEFLY, MARK_STARTED, RECLAIM_EXPIRED, RELEASE_UNSTARTED, SAMPLE_BACKLOG,
    STATISTICS, UNPARK_FREED, UNPARK_STRANDED,
};
use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::columns::Column;
use super::statements::Statement;
use super::{Result, Run, TxExecutor};

/// A batch of messages as column arrays, ready for one `unnest` insert (in [`insert_messages`],
/// and with a key's response in `keys::complete_key`).
pub struct MessageColumns {
    pub ids: Vec<Uuid>,
    pub destinations: Vec<String>,
    pub payloads: Vec<serde_json::Value>,
    pub headers: Vec<serde_json::Value>,
    pub downstream_keys: Vec<String>,
    pub ordering_keys: Vec<Option<String>>,
}

impl MessageColumns {
    /// Whether a message has an ordering key: such a batch is written by the statements that
    /// write a row behind an earlier row of its key waiting ([`INSERT_ORDERED`] and the key
    /// completions `*_with_ordered_messages`); the others keep the plainer ones.
    pub(crate) fn ordered(&self) -> bool {
        self.ordering_keys.iter().any(Option::is_some)
    }

    /// The statement that inserts these messages alone: [`INSERT`] or [`INSERT_ORDERED`].
    pub(crate) fn insert(&self) -> Statement {
        if self.ordered() {
            INSERT_ORDERED
        } else {
            INSERT
        }
    }
}

/// The parameters of a message insert, in the order both insert statements take them.
pub(super) fn columns(rows: &MessageColumns) -> [&(dyn ToSql + Sync); 6] {
    [
        &rows.ids,
        &rows.destinations,
        &rows.payloads,
        &rows.headers,
        &rows.downstream_keys,
        &rows.ordering_keys,
    ]
}

/// The rows an insert wrote: their ids and destinations.
pub struct Inserted {
    pub ids: Vec<Uuid>,
    pub destinations: Vec<String>,
}

impl Inserted {
    /// Decodes an insert's rows (id, destination), from whichever driver.
    pub(crate) fn decode<R>(rows: &[R]) -> std::result::Result<Self, R::Error>
    where
        R: Column<Uuid> + Column<String>,
    {
        let mut written = Inserted {
            ids: Vec::with_capacity(rows.len()),
            destinations: Vec::with_capacity(rows.len()),
        };
        for row in rows {
            written.ids.push(row.column(0)?);
            written.destinations.push(row.column(1)?);
        }
        Ok(written)
    }
}

/// Inserts the messages; a (destination, downstream key) already in the table is skipped.
pub(crate) async fn insert_messages(
    tx: &impl TxExecutor,
    rows: &MessageColumns,
) -> Result<Inserted> {
    Inserted::decode(&tx.run(rows.insert(), &columns(rows)).await?)
}

/// Takes the transaction-scoped advisory locks of `keys` (ordering keys), in a fixed order.
pub(crate) async fn lock_ordering_keys(tx: &impl TxExecutor, keys: &[&str]) -> Result<()> {
    tx.run(LOCK_ORDERING_KEYS, &[&keys]).await?;
    Ok(())
}

/// Takes the enqueue locks of `keys` (ordering keys) for the relay's completion, waiting at most
/// `wait` for each ([`LOCK_ORDERING_KEYS_BRIEFLY`]); a longer wait fails with SQLSTATE 55P03
/// (`lock_not_available`) and aborts the transaction.
pub(crate) async fn lock_ordering_keys_briefly(
    tx: &impl TxExecutor,
    keys: &[&str],
    wait: std::time::Duration,
) -> Result<()> {
    // At least 1 ms: a `lock_timeout` of 0 would wait for ever.
    let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX).max(1);
    tx.run(LOCK_ORDERING_KEYS_BRIEFLY, &[&keys, &wait_ms])
        .await?;
    Ok(())
}

/// How long a row waiting behind an earlier row of its ordering key is parked by a claim (the
/// completion of the row ahead of it ends the park at once, and [`UNPARK_FREED`] ends it when
/// that completion raced the claim).
const ORDERING_PARK_SECS: f64 = 30.0;
/// How long a row is parked when the head of its ordering key is dead (`failed` or `unknown`):
/// only an operator moves such a head, and replay (through the head's delivery), discard and
/// purge each end the park of the row behind it at once. Rows behind dead heads are read once per
/// park, so a longer park is what keeps them from costing every relay's claims; a head moved by
/// an operator while a claim parks the row behind it is seen by [`UNPARK_FREED`].
const DEAD_HEAD_PARK_SECS: f64 = 600.0;
/// A claim of the relay's.
pub(crate) struct ClaimDue<'a> {
    /// How many rows at most.
    pub limit: i64,
    /// The relay's owner id.
    pub owner: &'a str,
    /// The lease, in seconds.
    pub lease_secs: f64,
    /// The rows this relay holds an attempt of (never claimed again).
    pub held: &'a [Uuid],
    /// Destinations bounded by this relay, and how many rows of each the claim may take.
    pub bounded: &'a [String],
    pub room: &'a [i64],
    /// Claim with [`CLAIM_UNBOUNDED`] (the relay bounds no destination and saw no flow-control
    /// state at its last claim).
    pub unbounded: bool,
}

/// A row claimed under a new lease. The payload and headers come as the stored JSON text: a
/// document Postgres accepts but serde_json refuses (nesting deeper than 128, a number such as
/// `1e400`) must fail its own row when the relay decodes it, not the whole claim.
pub(crate) struct ClaimedRow {
    pub id: Uuid,
    pub destination: String,
    pub payload: String,
    pub headers: String,
    pub downstream_key: String,
    pub ordering_key: Option<String>,
    /// This attempt's number.
    pub attempts: i32,
    pub lease_token: i64,
    pub created_at: DateTime<Utc>,
    /// The attempt's start, by the database's clock.
    pub attempt_started_at: DateTime<Utc>,
}

/// What a claim took and saw.
pub(crate) struct Claimed {
    pub rows: Vec<ClaimedRow>,
    /// Rows parked behind the head of their ordering key.
    pub parked: i64,
    /// The first of them of each ordering key, for [`unpark_freed`] (every other row parked
    /// has that one ahead of it).
    pub parked_ids: Vec<Uuid>,
    /// The bounded destinations' states as the claim saw (and spent) them, as JSON.
    pub gates: Option<String>,
    /// An unbounded claim found a destination with a flow-control state and claimed nothing:
    /// claim again with the bounds.
    pub flow: bool,
}

/// Claims due rows under a new lease, within the flow-control bounds.
pub(crate) async fn claim_due(conn: &impl TxExecutor, claim: &ClaimDue<'_>) -> Result<Claimed> {
    let statement = if claim.unbounded {
        CLAIM_UNBOUNDED
    } else {
        CLAIM
    };
    let rows = conn
        .run(
            statement,
            &[
                &claim.limit,
                &claim.owner,
                &claim.lease_secs,
                &claim.held,
                &ORDERING_PARK_SECS,
                &claim.bounded,
                &claim.room,
                &DEAD_HEAD_PARK_SECS,
            ],
        )
        .await?;
    let parked = rows
        .first()
        .map(|r| r.try_get::<_, i64>("parked"))
        .transpose()?
        .unwrap_or(0);
    let parked_ids = rows
        .first()
        .map(|r| r.try_get::<_, Option<Vec<Uuid>>>("parked_ids"))
        .transpose()?
        .flatten()
        .unwrap_or_default();
    let gates = rows
        .first()
        .map(|r| r.try_get::<_, Option<String>>("gates"))
        .transpose()?
        .flatten();
    let flow = claim.unbounded
        && rows
            .first()
            .map(|r| r.try_get::<_, bool>("flow"))
            .transpose()?
            .unwrap_or(false);
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        // The claim's summary row carries NULLs when nothing was claimed.
        let Some(id) = row.try_get::<_, Option<Uuid>>("id")? else {
            continue;
        };
        claimed.push(ClaimedRow {
            id,
            destination: row.try_get("destination")?,
            payload: row.try_get("payload")?,
            headers: row.try_get("headers")?,
            downstream_key: row.try_get("downstream_key")?,
            ordering_key: row.try_get("ordering_key")?,
            attempts: row.try_get("attempts")?,
            lease_token: row.try_get("lease_token")?,
            created_at: row.try_get("created_at")?,
            attempt_started_at: row.try_get("attempt_started_at")?,
        });
    }
    Ok(Claimed {
        rows: claimed,
        parked,
        parked_ids,
        gates,
        flow,
    })
}

/// Ends the park of those of `parked` (rows a claim has just parked) whose ordering key has no
/// earlier row left; returns how many. Run after the claim committed ([`UNPARK_FREED`]).
pub(crate) async fn unpark_freed(conn: &impl TxExecutor, parked: &[Uuid]) -> Result<u64> {
    let rows = conn.run(UNPARK_FREED, &[&parked]).await?;
    Ok(rows.len() as u64)
}

/// What a sweep of the waiting rows did ([`unpark_stranded`]).
pub(crate) struct Sweep {
    /// The last ordering key it looked at: where the next sweep starts (`None`: it reached the
    /// end, the next starts again from the first key).
    pub last_key: Option<String>,
    /// Rows it made due: waiting rows with no earlier row of their key left.
    pub unparked: i64,
}

/// Makes due the first row of each of up to `keys` ordering keys after `after` when it is still
/// waiting with nothing ahead of it ([`UNPARK_STRANDED`]).
pub(crate) async fn unpark_stranded(
    conn: &impl TxExecutor,
    after: &str,
    keys: i64,
) -> Result<Sweep> {
    let rows = conn.run(UNPARK_STRANDED, &[&after, &keys]).await?;
    match rows.first() {
        Some(row) => Ok(Sweep {
            last_key: row.try_get(0)?,
            unparked: row.try_get(1)?,
        }),
        None => Ok(Sweep {
            last_key: None,
            unparked: 0,
        }),
    }
}

/// Marks the at-most-once attempt of row `id` (lease `token`) started; false when the lease is
/// no longer ours.
pub(crate) async fn mark_started(conn: &impl TxExecutor, id: Uuid, token: i64) -> Result<bool> {
    let rows = conn.run(MARK_STARTED, &[&id, &token]).await?;
    Ok(!rows.is_empty())
}

/// Gives back the rows `owner` holds whose sink was never called (all but `called`); returns
/// how many.
pub(crate) async fn release_unstarted(
    conn: &impl TxExecutor,
    owner: &str,
    called: &[Uuid],
) -> Result<u64> {
    let rows = conn.run(RELEASE_UNSTARTED, &[&owner, &called]).await?;
    Ok(rows.len() as u64)
}

/// Takes back up to `limit` rows whose lease expired (it logs their attempts in
/// `txoutbox_attempt_log` too); returns how many.
pub(crate) async fn reclaim_expired(conn: &impl TxExecutor, limit: i64) -> Result<i64> {
    let rows = conn.run(RECLAIM_EXPIRED, &[&limit]).await?;
    Ok(rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0))
}

/// What the planner knows of the hot table.
pub(crate) struct Statistics {
    /// It has column statistics.
    pub analyzed: bool,
    /// It has none, and holds 1 000 rows or more.
    pub large: bool,
}

/// Reads whether the hot table has statistics, and whether it is large without them.
pub(crate) async fn statistics(conn: &impl TxExecutor) -> Result<Statistics> {
    let rows = conn.run(STATISTICS, &[]).await?;
    let Some(row) = rows.first() else {
        return Ok(Statistics {
            analyzed: false,
            large: false,
        });
    };
    Ok(Statistics {
        analyzed: row.try_get(0)?,
        large: row.try_get(1)?,
    })
}

/// Gathers the hot table's statistics.
pub(crate) async fn analyze(conn: &impl TxExecutor) -> Result<()> {
    conn.run(ANALYZE, &[]).await?;
    Ok(())
}

/// The backlog: pending rows, and the age in seconds of the longest-waiting due row.
pub(crate) struct Backlog {
    pub pending: i64,
    pub oldest_secs: f64,
}

/// Samples the backlog; `None` if the statement returned no row.
pub(crate) async fn sample_backlog(conn: &impl TxExecutor) -> Result<Option<Backlog>> {
    let rows = conn.run(SAMPLE_BACKLOG, &[]).await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    Ok(Some(Backlog {
        pending: row.try_get(0)?,
        oldest_secs: row.try_get(1)?,
    }))
}

#[cfg(test)]
mod tests;
