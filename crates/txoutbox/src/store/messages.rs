//! `txoutbox_messages`, the hot outbox: the write path's insert and ordering-key locks; the
//! relay's claim, start mark, give-back and lease reclaim; the backlog sample. The literal
//! `status = 'pending'` in [`CLAIM`] and [`SAMPLE_BACKLOG`] matches the partial index
//! `txoutbox_messages_due`; keep it literal.

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

use super::{Result, TxExecutor};

/// Inserts a batch of messages; a (destination, downstream key) already present is skipped.
/// Returns the id and destination of each row written.
pub(super) const INSERT: &str = "INSERT INTO txoutbox_messages \
     (id, destination, payload, headers, downstream_key, ordering_key) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::text[], \
         $6::text[]) \
     ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination";

/// Serialises the transactions that enqueue under the same ordering keys, so that insertion
/// order (`seq`) is commit order within a key. Locks in a fixed order to avoid deadlocks.
pub(super) const LOCK_ORDERING_KEYS: &str = "SELECT count(pg_advisory_xact_lock(h)) FROM ( \
     SELECT DISTINCT hashtextextended(k, 7160) AS h FROM unnest($1::text[]) AS k ORDER BY h) AS l";

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

/// The parameters of a message insert, in the order both insert statements take them.
pub(super) fn columns(rows: &MessageColumns) -> [(&(dyn ToSql + Sync), Type); 6] {
    [
        (&rows.ids, Type::UUID_ARRAY),
        (&rows.destinations, Type::TEXT_ARRAY),
        (&rows.payloads, Type::JSONB_ARRAY),
        (&rows.headers, Type::JSONB_ARRAY),
        (&rows.downstream_keys, Type::TEXT_ARRAY),
        (&rows.ordering_keys, Type::TEXT_ARRAY),
    ]
}

/// The rows an insert wrote: their ids and destinations.
pub struct Inserted {
    pub ids: Vec<Uuid>,
    pub destinations: Vec<String>,
}

/// Inserts the messages; a (destination, downstream key) already in the table is skipped.
pub(crate) async fn insert_messages(
    tx: &impl TxExecutor,
    rows: &MessageColumns,
) -> Result<Inserted> {
    let inserted = tx.rows(INSERT, &columns(rows)).await?;
    let mut written = Inserted {
        ids: Vec::with_capacity(inserted.len()),
        destinations: Vec::with_capacity(inserted.len()),
    };
    for row in &inserted {
        written.ids.push(row.try_get(0)?);
        written.destinations.push(row.try_get(1)?);
    }
    Ok(written)
}

/// Takes the transaction-scoped advisory locks of `keys` (ordering keys), in a fixed order.
pub(crate) async fn lock_ordering_keys(tx: &impl TxExecutor, keys: &[&str]) -> Result<()> {
    tx.rows(LOCK_ORDERING_KEYS, &[(&keys, Type::TEXT_ARRAY)])
        .await?;
    Ok(())
}

/// The part of the claim that both [`CLAIM`] and [`CLAIM_UNBOUNDED`] share: from the
/// `candidates` (due rows, locked), the rows waiting behind an earlier row of their ordering key
/// are parked and up to $1 of the others claimed under a new lease.
macro_rules! claim_tail {
    () => {
        "blocked AS ( \
     SELECT c.id, head.dead FROM candidates c CROSS JOIN LATERAL ( \
         SELECT p.status IN ('failed', 'unknown') AS dead FROM txoutbox_messages p \
         WHERE p.ordering_key = c.ordering_key AND p.seq < c.seq ORDER BY p.seq LIMIT 1) head \
     WHERE c.ordering_key IS NOT NULL), \
 parked AS ( \
     UPDATE txoutbox_messages m SET next_attempt_at = now() + make_interval(secs => \
         CASE WHEN m.id = ANY(ARRAY(SELECT id FROM blocked WHERE dead)) THEN $8 ELSE $5 END) \
     WHERE m.id = ANY(ARRAY(SELECT id FROM blocked)) RETURNING m.id), \
 due AS ( \
     SELECT c.id FROM candidates c WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id) \
     ORDER BY c.next_attempt_at LIMIT $1), \
 claimed AS ( \
     UPDATE txoutbox_messages m SET status = 'in_flight', lease_owner = $2, \
         lease_expires_at = now() + make_interval(secs => $3), \
         lease_token = nextval('txoutbox_lease_token_seq'), attempts = m.attempts + 1, \
         attempt_started_at = now(), at_most_once = false \
     WHERE m.id = ANY(ARRAY(SELECT id FROM due)) \
     RETURNING m.id, m.destination, m.payload::text AS payload, m.headers::text AS headers, \
         m.downstream_key, m.ordering_key, m.attempts, m.lease_token, m.created_at, \
         m.attempt_started_at)"
    };
}

/// Claims up to $1 due rows under a new lease (owner $2, $3 seconds), skipping rows other relays
/// hold and the rows this relay still holds an attempt of ($4). A row with an ordering key is
/// claimable only when no earlier row of its key is still in the hot table.
///
/// The claim looks at no more than 4 × $1 due rows: those among them that wait behind an earlier
/// row of their ordering key are parked (their `next_attempt_at` moved $5 seconds on, $8 when the
/// key's head is dead, out of the due range; the completion of the row ahead brings the next one
/// back at once), so rows queued behind a blocked head are read once per park, not by every
/// claim. The claim costs the same however many rows wait behind blocked heads.
///
/// Flow control: destinations with a state in `txoutbox_destinations` (paused, throttled, a
/// breaker not closed, a rate limit, failures counted) are locked for the statement and bounded:
/// none while paused, throttled or open or while a half-open probe is out, one as the probe, no
/// more than the whole tokens of their bucket; destinations $6 are bounded by this relay too ($7
/// rows at most: its in-flight room, its ramp after a pause, 0 for its own holds). A bounded destination's rows are read apart (at most
/// its bound), so they neither starve nor take the others' place; the tokens its rows took are
/// spent and a probe's lease recorded in the same statement, so every relay shares one budget. A
/// destination none of whose rows were taken is not written: its bucket keeps accruing from its
/// last refill, which gives the same tokens as writing the refill now.
///
/// A half-open breaker's probe is a row never tried when one is due (the oldest due row else): a
/// row that failed before says more about itself than about the downstream, and the rows due
/// the longest behind an open breaker are the very ones whose failures opened it, so probing
/// them first would keep a healthy destination shut, each failed probe doubling the cool-down.
///
/// The UPDATE commits at once: no lock is held while sinks run. `at_most_once` is cleared: it is
/// set again, just before the call, only for an attempt that really starts ([`MARK_STARTED`]).
/// Always returns one row at least: `parked` (rows parked) and `gates` (the bounded destinations'
/// states, as JSON) with NULLs when nothing was claimed.
// `free` compares `destination || ''`, not the column: the planner estimates the column's
// `<> ALL(unknown array)` from its statistics, and with few destinations it expects almost no
// row to pass, so it sorts the whole hot table instead of reading the due index in order
// (O(backlog) per claim). The expression has no statistics, gets the default estimate, and the
// claim reads only the first due entries of the index. `claimed` and `parked` take their rows by
// `id = ANY(ARRAY(…))`, and `blocked` looks up the row ahead by a LATERAL with LIMIT 1: index
// lookups in every plan. The planner cannot know how many rows the bounded destinations' branch
// yields and guesses millions; joined to those guesses, the claim hashed the whole hot table
// (twice, once per join) on every claim that met rows behind a failed head (150 ms at 220 000
// rows, 26 ms after), and the generic plan of the prepared statement did so on every claim.
const CLAIM: &str = concat!(
    "WITH flow AS ( \
     SELECT d.destination, d.paused_at, d.breaker, d.open_until, d.probe_until, d.rate_per_sec, \
         d.burst, d.tokens, d.refilled_at, d.failures, d.throttled_until \
     FROM txoutbox_destinations d \
     WHERE d.paused_at IS NOT NULL OR d.rate_per_sec IS NOT NULL OR d.breaker <> 'closed' \
         OR d.failures > 0 OR d.throttled_until > now() \
     ORDER BY d.destination FOR NO KEY UPDATE), \
 gate AS ( \
     SELECT f.destination, f.rate_per_sec, f.failures, \
         CASE WHEN f.paused_at IS NOT NULL THEN 'paused' \
             WHEN f.throttled_until > now() THEN 'throttled' \
             WHEN f.breaker = 'open' AND f.open_until > now() THEN 'open' \
             WHEN f.breaker = 'half_open' AND f.probe_until > now() THEN 'probing' \
             WHEN f.breaker <> 'closed' THEN 'probe' \
             ELSE 'closed' END AS state, \
         CASE WHEN f.rate_per_sec IS NULL THEN NULL ELSE least(f.burst, f.tokens + f.rate_per_sec \
             * greatest(EXTRACT(EPOCH FROM now() - f.refilled_at)::float8, 0)) END AS avail, \
         EXTRACT(EPOCH FROM CASE WHEN f.throttled_until > now() THEN f.throttled_until \
             ELSE f.open_until END - now())::float8 AS open_for \
     FROM flow f), \
 bound AS ( \
     SELECT COALESCE(g.destination, l.destination) AS destination, \
         COALESCE(g.state = 'probe', false) AS probe, least( \
         CASE WHEN g.state IN ('paused', 'throttled', 'open', 'probing') THEN 0 \
             WHEN g.state = 'probe' THEN 1 ELSE $1 END, \
         COALESCE(floor(g.avail)::int8, $1), COALESCE(l.room, $1)) AS n \
     FROM (SELECT * FROM gate WHERE state <> 'closed' OR avail IS NOT NULL) g \
     FULL JOIN unnest($6::text[], $7::int8[]) AS l(destination, room) \
         ON l.destination = g.destination), \
 free AS ( \
     SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m \
     WHERE m.status = 'pending' AND m.next_attempt_at <= now() AND m.id <> ALL($4::uuid[]) \
         AND (m.destination || '') <> ALL(ARRAY(SELECT destination FROM bound)) \
     ORDER BY m.next_attempt_at \
     LIMIT $1 * 4 \
     FOR UPDATE SKIP LOCKED), \
 bounded AS ( \
     SELECT r.* FROM bound b CROSS JOIN LATERAL ( \
         SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m \
         WHERE m.status = 'pending' AND m.next_attempt_at <= now() \
             AND m.id <> ALL($4::uuid[]) AND m.destination = b.destination \
         ORDER BY m.next_attempt_at \
         LIMIT b.n \
         FOR UPDATE SKIP LOCKED) r \
     WHERE b.n > 0 AND NOT b.probe \
     UNION ALL \
     SELECT r.* FROM bound b CROSS JOIN LATERAL ( \
         SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m \
         WHERE m.id = COALESCE( \
             (SELECT f.id FROM txoutbox_messages f WHERE f.status = 'pending' \
                 AND f.next_attempt_at <= now() AND f.id <> ALL($4::uuid[]) \
                 AND f.destination = b.destination AND f.attempts = 0 \
                 ORDER BY f.next_attempt_at LIMIT 1), \
             (SELECT f.id FROM txoutbox_messages f WHERE f.status = 'pending' \
                 AND f.next_attempt_at <= now() AND f.id <> ALL($4::uuid[]) \
                 AND f.destination = b.destination \
                 ORDER BY f.next_attempt_at LIMIT 1)) \
             AND m.status = 'pending' AND m.next_attempt_at <= now() \
         FOR UPDATE SKIP LOCKED) r \
     WHERE b.n > 0 AND b.probe), \
 candidates AS (SELECT * FROM free UNION ALL SELECT * FROM bounded),",
    claim_tail!(),
    ", \
 taken AS (SELECT destination, count(*) AS n FROM claimed GROUP BY destination), \
 spent AS ( \
     UPDATE txoutbox_destinations d SET \
         tokens = CASE WHEN g.avail IS NULL THEN d.tokens ELSE g.avail - t.n END, \
         refilled_at = CASE WHEN g.avail IS NULL THEN d.refilled_at ELSE now() END, \
         breaker = CASE WHEN g.state = 'probe' THEN 'half_open' ELSE d.breaker END, \
         probe_until = CASE WHEN g.state = 'probe' \
             THEN now() + make_interval(secs => $3) ELSE d.probe_until END \
     FROM gate g JOIN taken t ON t.destination = g.destination \
     WHERE d.destination = g.destination AND (g.avail IS NOT NULL OR g.state = 'probe')), \
 gates AS ( \
     SELECT json_agg(json_build_object('destination', g.destination, 'state', \
         CASE WHEN g.state = 'probe' AND t.n > 0 THEN 'probing' ELSE g.state END, \
         'tokens', g.avail - COALESCE(t.n, 0), 'rate', g.rate_per_sec, \
         'open_for', g.open_for, 'failures', g.failures))::text AS gates \
     FROM gate g LEFT JOIN taken t ON t.destination = g.destination) \
 SELECT p.parked, CASE WHEN row_number() OVER () = 1 THEN p.parked_ids END AS parked_ids, \
     gs.gates, c.* FROM (SELECT count(*) AS parked, array_agg(id) AS parked_ids FROM parked) p \
     CROSS JOIN gates gs LEFT JOIN claimed c ON true"
);

/// [`CLAIM`] for a relay that bounds no destination itself, while no destination has a
/// flow-control state: the same claim without the flow-control branches, which are most of the
/// statement's planning time (about 2.3 of its 3.5 ms on a small table). `flow` says whether a
/// destination has a state now (paused, throttled, a breaker not closed, a rate limit, failures
/// counted);
/// then this claims nothing, and the relay claims again with [`CLAIM`]. The test and the claim
/// read one snapshot, so a row is claimed here only when [`CLAIM`] would also have claimed it.
/// Takes [`CLAIM`]'s parameters and leaves $6 and $7 unread.
const CLAIM_UNBOUNDED: &str = concat!(
    "WITH guard AS ( \
     SELECT EXISTS (SELECT 1 FROM txoutbox_destinations d \
         WHERE d.paused_at IS NOT NULL OR d.rate_per_sec IS NOT NULL OR d.breaker <> 'closed' \
             OR d.failures > 0 OR d.throttled_until > now()) AS flow), \
 candidates AS ( \
     SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m \
     WHERE m.status = 'pending' AND m.next_attempt_at <= now() AND m.id <> ALL($4::uuid[]) \
         AND NOT (SELECT flow FROM guard) \
     ORDER BY m.next_attempt_at \
     LIMIT $1 * 4 \
     FOR UPDATE SKIP LOCKED), ",
    claim_tail!(),
    " SELECT g.flow, p.parked, \
     CASE WHEN row_number() OVER () = 1 THEN p.parked_ids END AS parked_ids, \
     NULL::text AS gates, c.* FROM guard g \
     CROSS JOIN (SELECT count(*) AS parked, array_agg(id) AS parked_ids FROM parked) p \
     LEFT JOIN claimed c ON true"
);

/// Ends the park of the rows $1 a claim has just parked whose ordering key has no earlier row left
/// (the head's completion committed after the claim's snapshot was taken, so the claim still saw
/// it; its unpark found the rows not yet parked). Runs in a snapshot taken after the claim
/// committed, so it sees every completion the claim could have missed; a completion that commits
/// later unparks the rows itself. Skips rows another transaction holds: a completion unparking
/// them, or another claim, which rechecks them in turn (and waiting could deadlock with a
/// completion that holds the head). Unparking a row that should wait is harmless: every claim
/// checks the head again. The row ahead is looked up by a scalar subquery with LIMIT 1, an index
/// lookup per parked row: as an anti-join the planner hashed the whole hot table.
const UNPARK_FREED: &str = "WITH freed AS ( \
     SELECT m.id FROM txoutbox_messages m \
     WHERE m.id = ANY($1::uuid[]) AND m.status = 'pending' AND ( \
         SELECT p.seq FROM txoutbox_messages p \
         WHERE p.ordering_key = m.ordering_key AND p.seq < m.seq ORDER BY p.seq LIMIT 1) IS NULL \
     FOR UPDATE SKIP LOCKED) \
 UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now()) \
 FROM freed f WHERE m.id = f.id RETURNING m.id";

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
    /// Their ids, for [`unpark_freed`].
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
        .rows(
            statement,
            &[
                (&claim.limit, Type::INT8),
                (&claim.owner, Type::TEXT),
                (&claim.lease_secs, Type::FLOAT8),
                (&claim.held, Type::UUID_ARRAY),
                (&ORDERING_PARK_SECS, Type::FLOAT8),
                (&claim.bounded, Type::TEXT_ARRAY),
                (&claim.room, Type::INT8_ARRAY),
                (&DEAD_HEAD_PARK_SECS, Type::FLOAT8),
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
    let rows = conn
        .rows(UNPARK_FREED, &[(&parked, Type::UUID_ARRAY)])
        .await?;
    Ok(rows.len() as u64)
}

/// Commits the start of an at-most-once attempt ($1, under lease token $2) just before its sink
/// is called: from here on a lost outcome makes the row `unknown`, not pending. Returns no row
/// when the lease is no longer ours (then the call is not made).
const MARK_STARTED: &str = "UPDATE txoutbox_messages SET at_most_once = true \
     WHERE id = $1 AND lease_token = $2 RETURNING 1";
/// Marks the at-most-once attempt of row `id` (lease `token`) started; false when the lease is
/// no longer ours.
pub(crate) async fn mark_started(conn: &impl TxExecutor, id: Uuid, token: i64) -> Result<bool> {
    let rows = conn
        .rows(MARK_STARTED, &[(&id, Type::UUID), (&token, Type::INT8)])
        .await?;
    Ok(!rows.is_empty())
}

/// At shutdown, gives back every row this relay ($1) still holds whose sink was never called
/// (not one of $2, the rows whose call started): pending again at once, the attempt not counted.
/// It catches what a claim cut short by the shutdown committed after the relay stopped waiting.
const RELEASE_UNSTARTED: &str = "UPDATE txoutbox_messages SET status = 'pending', \
     attempts = greatest(attempts - 1, 0), lease_owner = NULL, lease_expires_at = NULL, \
     lease_token = NULL, at_most_once = false \
     WHERE status = 'in_flight' AND lease_owner = $1 AND id <> ALL($2::uuid[]) RETURNING id";
/// Gives back the rows `owner` holds whose sink was never called (all but `called`); returns
/// how many.
pub(crate) async fn release_unstarted(
    conn: &impl TxExecutor,
    owner: &str,
    called: &[Uuid],
) -> Result<u64> {
    let rows = conn
        .rows(
            RELEASE_UNSTARTED,
            &[(&owner, Type::TEXT), (&called, Type::UUID_ARRAY)],
        )
        .await?;
    Ok(rows.len() as u64)
}

/// Takes back rows whose lease expired (their relay died, paused or lost the network): pending
/// again with the same key, or `unknown` for at-most-once destinations, where the attempt may
/// have reached the downstream and must not be repeated blindly. At most $1 rows per call.
const RECLAIM_EXPIRED: &str = "WITH expired AS ( \
     SELECT id, destination, lease_owner, lease_token, attempts, downstream_key, \
         attempt_started_at, at_most_once FROM txoutbox_messages \
     WHERE status = 'in_flight' AND lease_expires_at < now() \
     ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED), \
 moved AS ( \
     UPDATE txoutbox_messages m SET \
         status = CASE WHEN e.at_most_once THEN 'unknown' ELSE 'pending' END, \
         next_attempt_at = now(), \
         last_error = 'the lease of relay ' || e.lease_owner || ' expired during attempt ' \
             || e.attempts || CASE WHEN e.at_most_once \
                 THEN ' (at-most-once destination: not retried; replay it if it did not happen)' \
                 ELSE '' END, \
         lease_owner = NULL, lease_expires_at = NULL, lease_token = NULL \
     FROM expired e WHERE m.id = e.id \
     RETURNING m.id, m.last_error, m.status), \
 logged AS ( \
     INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, relay, \
         lease_token, outcome, error, started_at) \
     SELECT e.id, e.destination, e.attempts, e.downstream_key, e.lease_owner, e.lease_token, \
         CASE WHEN mv.status = 'unknown' THEN 'unknown' ELSE 'expired' END, mv.last_error, \
         COALESCE(e.attempt_started_at, now()) \
     FROM expired e JOIN moved mv ON mv.id = e.id) \
 SELECT count(*) FROM moved";
/// Takes back up to `limit` rows whose lease expired (it logs their attempts in
/// `txoutbox_attempt_log` too); returns how many.
pub(crate) async fn reclaim_expired(conn: &impl TxExecutor, limit: i64) -> Result<i64> {
    let rows = conn.rows(RECLAIM_EXPIRED, &[(&limit, Type::INT8)]).await?;
    Ok(rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0))
}

/// Whether the planner has column statistics for the hot table, and (only when it has none)
/// whether the table holds 1 000 rows or more. Without statistics the planner guesses a dozen
/// pending rows whatever the backlog, and the claim reads every due row and sorts them instead
/// of walking the due index.
const STATISTICS: &str = "WITH s AS (SELECT EXISTS ( \
         SELECT 1 FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename \
             JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname \
         WHERE c.oid = 'txoutbox_messages'::regclass AND s.attname = 'status') AS analyzed) \
 SELECT analyzed, \
     CASE WHEN analyzed THEN false \
         ELSE EXISTS (SELECT 1 FROM txoutbox_messages OFFSET 999) END AS large \
 FROM s";
/// Gathers the hot table's statistics (a role that does not own the table gets a warning and
/// nothing changes).
const ANALYZE: &str = "ANALYZE txoutbox_messages";

/// What the planner knows of the hot table.
pub(crate) struct Statistics {
    /// It has column statistics.
    pub analyzed: bool,
    /// It has none, and holds 1 000 rows or more.
    pub large: bool,
}

/// Reads whether the hot table has statistics, and whether it is large without them.
pub(crate) async fn statistics(conn: &impl TxExecutor) -> Result<Statistics> {
    let rows = conn.rows(STATISTICS, &[]).await?;
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
    conn.rows(ANALYZE, &[]).await?;
    Ok(())
}

/// The backlog gauges: pending rows, and how long the longest-waiting due row has been due. Both
/// read only the partial index `txoutbox_messages_due` (the literal `'pending'` selects it): a
/// count over it, and its first entry.
const SAMPLE_BACKLOG: &str = "SELECT \
     (SELECT count(*) FROM txoutbox_messages WHERE status = 'pending'), \
     COALESCE((SELECT EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8 \
         FROM txoutbox_messages WHERE status = 'pending' AND next_attempt_at <= now()), 0)::float8";
/// The backlog: pending rows, and the age in seconds of the longest-waiting due row.
pub(crate) struct Backlog {
    pub pending: i64,
    pub oldest_secs: f64,
}

/// Samples the backlog; `None` if the statement returned no row.
pub(crate) async fn sample_backlog(conn: &impl TxExecutor) -> Result<Option<Backlog>> {
    let rows = conn.rows(SAMPLE_BACKLOG, &[]).await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    Ok(Some(Backlog {
        pending: row.try_get(0)?,
        oldest_secs: row.try_get(1)?,
    }))
}
