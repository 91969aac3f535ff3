//! What a replay reads, locks and writes; the lock reads serve a discard too.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};
use uuid::Uuid;

use super::ids_by_status;
use crate::admin::{AdminError, FilterParams};
use crate::state::MessageStatus;

/// True when $1 was discarded (a replay by id names it: refused with the reason).
const IS_DISCARDED: &str = "SELECT EXISTS (SELECT 1 FROM txoutbox_discarded WHERE id = $1)";

/// The ids a replay by filter selects: hot rows of the statuses $1, then delivered rows when $1
/// holds `delivered`, each in insertion order; at most $9 (NULL: all). Taken without locks: each
/// batch locks and checks its rows again.
const REPLAY_SELECT: &str = concat!(
    "SELECT id FROM ( \
     SELECT t.id, 0 AS place, t.seq FROM txoutbox_messages t \
     WHERE t.status = ANY($1::text[]) AND ",
    filter!(hot),
    " UNION ALL \
     SELECT t.id, 1, t.seq FROM txoutbox_delivered t \
     WHERE 'delivered' = ANY($1::text[]) AND ",
    filter!(delivered),
    ") s ORDER BY place, seq LIMIT $9"
);

/// Bounds every lock wait of a replay transaction: a row locked for long is an error, not a hang.
const LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', '5s', true)";

/// Locks the hot rows among $1 (in id order, so two operators cannot deadlock). A relay's claim
/// skips locked rows and its completion waits for them, so nothing changes them until commit.
const LOCK_HOT: &str = "SELECT id, status, destination, downstream_key, ordering_key, \
         lease_owner, lease_expires_at, COALESCE(lease_expires_at > now(), false) \
     FROM txoutbox_messages WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE";

/// [`LOCK_HOT`] without the locks, for a dry run.
const READ_HOT: &str = "SELECT id, status, destination, downstream_key, ordering_key, \
         lease_owner, lease_expires_at, COALESCE(lease_expires_at > now(), false) \
     FROM txoutbox_messages WHERE id = ANY($1::uuid[]) ORDER BY id";

/// Locks the delivered rows among $1 (the pruner skips locked rows).
const LOCK_DELIVERED: &str = "SELECT id, destination, downstream_key, ordering_key \
     FROM txoutbox_delivered WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE";

/// [`LOCK_DELIVERED`] without the locks, for a dry run.
const READ_DELIVERED: &str = "SELECT id, destination, downstream_key, ordering_key \
     FROM txoutbox_delivered WHERE id = ANY($1::uuid[]) ORDER BY id";

/// The hot rows that already carry a (destination, downstream key) of delivered rows about to be
/// moved back (the same effect enqueued again after its delivery): pairs (delivered id, hot id).
const KEY_TAKEN: &str = "SELECT i.id, m.id \
     FROM unnest($1::uuid[], $2::text[], $3::text[]) AS i(id, destination, downstream_key) \
     JOIN txoutbox_messages m ON m.destination = i.destination \
         AND m.downstream_key = i.downstream_key AND m.id <> i.id";

/// Puts hot rows $1 back to pending with downstream keys $2: due now, a fresh attempt budget, no
/// lease (a late completion of an old lease is fenced off by the cleared token), no last error.
const REPLAY_HOT: &str = "UPDATE txoutbox_messages m SET status = 'pending', \
         next_attempt_at = now(), attempts = 0, lease_owner = NULL, lease_expires_at = NULL, \
         lease_token = NULL, attempt_started_at = NULL, at_most_once = false, last_error = NULL, \
         downstream_key = i.downstream_key \
     FROM unnest($1::uuid[], $2::text[]) AS i(id, downstream_key) \
     WHERE m.id = i.id RETURNING m.id";

/// Moves delivered rows $1 back into the hot table as pending, with downstream keys $2. They get
/// a new `seq`: a redelivery queues behind the rows of its ordering key that wait now. The
/// delivering attempt a row carries (V4) moves to the attempt log, so the history stays whole.
const MOVE_DELIVERED: &str = "WITH moved AS ( \
     DELETE FROM txoutbox_delivered d \
     USING unnest($1::uuid[], $2::text[]) AS i(id, downstream_key) \
     WHERE d.id = i.id \
     RETURNING d.id, d.seq, d.destination, d.payload, d.headers, i.downstream_key, \
         d.ordering_key, d.created_at, d.attempts, d.downstream_key AS attempt_key, d.relay, \
         d.lease_token, d.receipt, d.attempt_started_at, d.delivered_at), \
 kept AS ( \
     INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, relay, \
         lease_token, outcome, receipt, started_at, finished_at) \
     SELECT id, destination, attempts, attempt_key, relay, lease_token, 'delivered', receipt, \
         attempt_started_at, delivered_at FROM moved WHERE relay IS NOT NULL) \
 INSERT INTO txoutbox_messages (id, destination, payload, headers, downstream_key, \
     ordering_key, status, attempts, next_attempt_at, created_at) \
 SELECT id, destination, payload, headers, downstream_key, ordering_key, 'pending', 0, now(), \
     created_at FROM moved ORDER BY seq \
 RETURNING id";

/// Logs one operator replay per row: attempt 0, relay `operator`, outcome `replayed`, the key the
/// row carries from now on, and a note ($3) saying what changed.
const LOG_REPLAYS: &str = "INSERT INTO txoutbox_attempt_log (message_id, attempt, \
         downstream_key, relay, outcome, error, started_at, finished_at) \
     SELECT i.id, 0, i.downstream_key, 'operator', 'replayed', i.note, now(), now() \
     FROM unnest($1::uuid[], $2::text[], $3::text[]) AS i(id, downstream_key, note)";

/// True when message `id` was discarded ([`IS_DISCARDED`]).
pub(crate) async fn is_discarded(
    client: &impl GenericClient,
    id: Uuid,
) -> Result<bool, AdminError> {
    Ok(client
        .query_typed_one(IS_DISCARDED, &[(&id, Type::UUID)])
        .await?
        .try_get(0)?)
}

/// The ids a replay by filter selects among `statuses` ([`REPLAY_SELECT`]).
pub(crate) async fn select(
    client: &impl GenericClient,
    statuses: &[MessageStatus],
    filter: &FilterParams,
) -> Result<Vec<Uuid>, AdminError> {
    ids_by_status(client, REPLAY_SELECT, statuses, filter).await
}

/// Bounds the lock waits of the rest of the transaction ([`LOCK_TIMEOUT`]).
pub(crate) async fn set_lock_timeout(tx: &Transaction<'_>) -> Result<(), AdminError> {
    tx.query_typed(LOCK_TIMEOUT, &[]).await?;
    Ok(())
}

/// A selected row as found, locked unless in a dry run.
pub(crate) struct Candidate {
    pub(crate) id: Uuid,
    pub(crate) status: MessageStatus,
    pub(crate) destination: String,
    pub(crate) downstream_key: String,
    pub(crate) ordering_key: Option<String>,
    pub(crate) lease_owner: Option<String>,
    pub(crate) lease_expires_at: Option<DateTime<Utc>>,
    /// Its lease is still live.
    pub(crate) leased: bool,
}

/// The hot rows among `ids`, locked ([`LOCK_HOT`]) unless `read_only` ([`READ_HOT`]).
pub(crate) async fn hot_rows(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    read_only: bool,
) -> Result<Vec<Candidate>, AdminError> {
    let statement = if read_only { READ_HOT } else { LOCK_HOT };
    let ids = ids.to_vec();
    tx.query_typed(statement, &[(&ids, Type::UUID_ARRAY)])
        .await?
        .iter()
        .map(|row| {
            Ok(Candidate {
                id: row.try_get(0)?,
                status: row.try_get::<_, String>(1)?.parse()?,
                destination: row.try_get(2)?,
                downstream_key: row.try_get(3)?,
                ordering_key: row.try_get(4)?,
                lease_owner: row.try_get(5)?,
                lease_expires_at: row.try_get(6)?,
                leased: row.try_get(7)?,
            })
        })
        .collect()
}

/// The delivered rows among `ids`, locked ([`LOCK_DELIVERED`]) unless `read_only`
/// ([`READ_DELIVERED`]).
pub(crate) async fn delivered_rows(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    read_only: bool,
) -> Result<Vec<Candidate>, AdminError> {
    let statement = if read_only {
        READ_DELIVERED
    } else {
        LOCK_DELIVERED
    };
    tx.query_typed(statement, &[(&ids, Type::UUID_ARRAY)])
        .await?
        .iter()
        .map(|row| {
            Ok(Candidate {
                id: row.try_get(0)?,
                status: MessageStatus::Delivered,
                destination: row.try_get(1)?,
                downstream_key: row.try_get(2)?,
                ordering_key: row.try_get(3)?,
                lease_owner: None,
                lease_expires_at: None,
                leased: false,
            })
        })
        .collect()
}

/// Pairs (delivered id, hot id) of hot rows already carrying the (destination, key) of a
/// delivered row about to move back ([`KEY_TAKEN`]).
pub(crate) async fn keys_taken(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    destinations: &[&str],
    keys: &[&str],
) -> Result<Vec<(Uuid, Uuid)>, AdminError> {
    tx.query_typed(
        KEY_TAKEN,
        &[
            (&ids, Type::UUID_ARRAY),
            (&destinations, Type::TEXT_ARRAY),
            (&keys, Type::TEXT_ARRAY),
        ],
    )
    .await?
    .iter()
    .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
    .collect()
}

/// Puts hot rows `ids` back to pending with downstream keys `keys` ([`REPLAY_HOT`]).
pub(crate) async fn replay_hot(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    keys: &[String],
) -> Result<(), AdminError> {
    tx.query_typed(
        REPLAY_HOT,
        &[(&ids, Type::UUID_ARRAY), (&keys, Type::TEXT_ARRAY)],
    )
    .await?;
    Ok(())
}

/// Moves delivered rows `ids` back to the hot table with keys `keys` ([`MOVE_DELIVERED`]).
pub(crate) async fn move_delivered(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    keys: &[String],
) -> Result<(), AdminError> {
    tx.query_typed(
        MOVE_DELIVERED,
        &[(&ids, Type::UUID_ARRAY), (&keys, Type::TEXT_ARRAY)],
    )
    .await?;
    Ok(())
}

/// Logs one operator replay per row ([`LOG_REPLAYS`]).
pub(crate) async fn log_replays(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    keys: &[&str],
    notes: &[String],
) -> Result<(), AdminError> {
    tx.query_typed(
        LOG_REPLAYS,
        &[
            (&ids, Type::UUID_ARRAY),
            (&keys, Type::TEXT_ARRAY),
            (&notes, Type::TEXT_ARRAY),
        ],
    )
    .await?;
    Ok(())
}
