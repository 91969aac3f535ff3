//! What a replay reads, locks and writes; the lock reads serve a discard too.

use crate::store::statements::attempt_log::LOG_REPLAYS;
use crate::store::statements::delivered::{
    REPLAY_LOCK as LOCK_DELIVERED, REPLAY_MOVE as MOVE_DELIVERED, REPLAY_READ as READ_DELIVERED,
};
use crate::store::statements::discarded::EXISTS as IS_DISCARDED;
use crate::store::statements::messages::{
    REPLAY as REPLAY_HOT, REPLAY_KEY_TAKEN as KEY_TAKEN, REPLAY_LOCK as LOCK_HOT,
    REPLAY_READ as READ_HOT, REPLAY_SELECT,
};
use crate::store::statements::session::REPLAY_LOCK_TIMEOUT as LOCK_TIMEOUT;
use chrono::{DateTime, Utc};
use tokio_postgres::{GenericClient, Transaction};
use uuid::Uuid;

use super::{ids_by_status, rows, run, value};
use crate::admin::{AdminError, FilterParams};
use crate::state::MessageStatus;

/// True when message `id` was discarded ([`IS_DISCARDED`]).
pub(crate) async fn is_discarded(
    client: &impl GenericClient,
    id: Uuid,
) -> Result<bool, AdminError> {
    value(client, IS_DISCARDED, &[&id]).await
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
    run(tx, LOCK_TIMEOUT, &[]).await
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
    rows(tx, statement, &[&ids], |row| {
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
    .await
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
    rows(tx, statement, &[&ids], |row| {
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
    .await
}

/// Pairs (delivered id, hot id) of hot rows already carrying the (destination, key) of a
/// delivered row about to move back ([`KEY_TAKEN`]).
pub(crate) async fn keys_taken(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    destinations: &[&str],
    keys: &[&str],
) -> Result<Vec<(Uuid, Uuid)>, AdminError> {
    rows(tx, KEY_TAKEN, &[&ids, &destinations, &keys], |row| {
        Ok((row.try_get(0)?, row.try_get(1)?))
    })
    .await
}

/// Puts rows `ids` back to pending with downstream keys `keys`: hot rows in place
/// ([`REPLAY_HOT`]), delivered rows moved back to the hot table ([`MOVE_DELIVERED`]).
pub(crate) async fn put_back(
    tx: &Transaction<'_>,
    delivered: bool,
    ids: &[Uuid],
    keys: &[String],
) -> Result<(), AdminError> {
    let statement = if delivered {
        MOVE_DELIVERED
    } else {
        REPLAY_HOT
    };
    run(tx, statement, &[&ids, &keys]).await
}

/// Logs one operator replay per row ([`LOG_REPLAYS`]).
pub(crate) async fn log_replays(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    keys: &[&str],
    notes: &[String],
) -> Result<(), AdminError> {
    run(tx, LOG_REPLAYS, &[&ids, &keys, &notes]).await
}
