//! `txoutbox_idempotency_keys`: claim a key, read a key someone else holds, store the response
//! (with the request's outbox rows), prune expired keys.

use super::statements::idempotency_keys::{
    AWAITING_FAN_OUT, CLAIM, COMPLETE_INSERT, COMPLETE_INSERT_WITH_MESSAGES,
    COMPLETE_INSERT_WITH_ORDERED_MESSAGES, COMPLETE_TAKE_OVER, COMPLETE_TAKE_OVER_WITH_MESSAGES,
    COMPLETE_TAKE_OVER_WITH_ORDERED_MESSAGES, COMPLETE_UPDATE, COMPLETE_UPDATE_WITH_MESSAGES,
    COMPLETE_UPDATE_WITH_ORDERED_MESSAGES, FAN_OUT, LOCK_TRY, LOCK_WAIT, LOOKUP, LOOKUP_RESTORE,
    PRUNE_EXPIRED,
};
use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::driver::{self, FoundRow, LockRow};
use super::messages::{self, MessageColumns};
use super::statements::Statement;
use super::{Result, Run, TxExecutor};

/// How a key is stored, by [`KeyWrite`]: without outbox rows to write now, with rows none of
/// which has an ordering key, and with rows among which one has (written waiting behind an
/// earlier row of their key).
const STORE: [(Statement, Statement, Statement); 3] = [
    (
        COMPLETE_INSERT,
        COMPLETE_INSERT_WITH_MESSAGES,
        COMPLETE_INSERT_WITH_ORDERED_MESSAGES,
    ),
    (
        COMPLETE_TAKE_OVER,
        COMPLETE_TAKE_OVER_WITH_MESSAGES,
        COMPLETE_TAKE_OVER_WITH_ORDERED_MESSAGES,
    ),
    (
        COMPLETE_UPDATE,
        COMPLETE_UPDATE_WITH_MESSAGES,
        COMPLETE_UPDATE_WITH_ORDERED_MESSAGES,
    ),
];

/// What [`lock_and_lookup`] found behind the key's lock.
pub struct Locked {
    /// The transaction runs at READ COMMITTED: the key row is written at the end (else [`CLAIM`]
    /// writes it now).
    pub read_committed: bool,
    /// The transaction's time.
    pub now: DateTime<Utc>,
    /// The backend's pid.
    pub backend_pid: i32,
    /// The key, when a live one exists.
    pub key: Option<KeyRow>,
    /// An expired key exists (the request takes it over).
    pub expired: bool,
}

/// A key some request stored, as [`lock_and_lookup`] read it. The response headers come as
/// their stored JSON text: a row this build cannot decode fails its own request when the caller
/// decodes it, not the lookup.
pub struct KeyRow {
    pub fingerprint: Vec<u8>,
    /// `in_flight` or `completed`.
    pub state: String,
    pub response_status: Option<i16>,
    pub response_headers: Option<String>,
    pub response_body: Option<Vec<u8>>,
}

/// Takes the lock of the key (scope, key), waiting at most `lock_timeout` (as Postgres reads
/// it: `2000ms`) when another request holds it, and reads the key behind it; one round trip
/// when the lock is free (the two statements are pipelined), two when it is held. The error of a
/// lock timeout, a serialization failure or a deadlock is the database's, for the caller to read
/// its SQLSTATE. `None` if the lock statement answered no row (it answers one).
pub(crate) async fn lock_and_lookup(
    tx: &impl TxExecutor,
    scope: &str,
    key: &str,
    lock_timeout: &str,
) -> Result<Option<Locked>> {
    let key_values: [&(dyn ToSql + Sync); 2] = [&scope, &key];
    let (lock_params, key_params) = (LOCK_TRY.bind(&key_values), LOOKUP.bind(&key_values));
    let (locked, found) = tx
        .rows_in_order((LOCK_TRY.sql, &lock_params), (LOOKUP.sql, &key_params))
        .await;
    // The lock's error first: the lookup fails after it only because the transaction aborted.
    let locked = locked?;
    let found = found?;
    let Some(lock) = locked.first() else {
        return Ok(None);
    };
    let (lock, found) = if lock.try_get::<_, bool>(0)? {
        (lock.clone(), found)
    } else {
        // Held by a concurrent request: the lookup read what is not ours to read yet.
        let wait_params = LOCK_WAIT.bind(&[&scope, &key, &lock_timeout]);
        let restore_params = LOOKUP_RESTORE.bind(&key_values);
        let (locked, found) = tx
            .rows_in_order(
                (LOCK_WAIT.sql, &wait_params),
                (LOOKUP_RESTORE.sql, &restore_params),
            )
            .await;
        let locked = locked?;
        let Some(lock) = locked.into_iter().next() else {
            return Ok(None);
        };
        (lock, found?)
    };
    let lock = LockRow::decode(&lock)?;
    let found = found.first().map(FoundRow::decode).transpose()?;
    Ok(Some(driver::locked(lock, found)))
}

/// The key to claim at the start of a request (REPEATABLE READ, SERIALIZABLE).
pub struct ClaimKey<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a [u8],
    /// The key window, in seconds.
    pub window_secs: f64,
    /// The lock timeout while waiting for a concurrent holder, as Postgres reads it (`2000ms`).
    pub lock_timeout: &'a str,
}

/// Inserts the key row now; false when a live key holds it. The error of a lock timeout or a
/// serialization failure is the database's, for the caller to read its SQLSTATE.
pub(crate) async fn claim_key(tx: &impl TxExecutor, claim: &ClaimKey<'_>) -> Result<bool> {
    let rows = tx
        .run(
            CLAIM,
            &[
                &claim.scope,
                &claim.key,
                &claim.fingerprint,
                &claim.window_secs,
                &claim.lock_timeout,
            ],
        )
        .await?;
    Ok(!rows.is_empty())
}

/// What stores a claimed key: the response, the effects the key row carries, the request's
/// other outbox rows.
pub struct CompleteKey<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a [u8],
    pub window_secs: f64,
    pub status: i16,
    pub headers: &'a serde_json::Value,
    pub body: &'a [u8],
    /// Rows written now.
    pub messages: &'a MessageColumns,
    /// Effects carried by the key row (a JSON array), fanned out by the relay.
    pub effects: Option<&'a serde_json::Value>,
    /// The claim's backend and time: the key is stored only in the claim's transaction.
    pub backend_pid: i32,
    pub claimed_at: DateTime<Utc>,
    /// How the key row is written.
    pub write: KeyWrite,
    /// Refuse a transaction with a savepoint open (a COMMIT follows in the same round trip).
    pub outermost: bool,
}

impl CompleteKey<'_> {
    pub(super) fn statement(&self) -> Statement {
        let (alone, with_rows, with_ordered_rows) = STORE[self.write as usize];
        if self.messages.ids.is_empty() {
            alone
        } else if self.messages.ordered() {
            with_ordered_rows
        } else {
            with_rows
        }
    }

    /// The values of [`Self::statement`]'s parameters, $1 first.
    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &self.scope,
            &self.key,
            &self.fingerprint,
            &self.status,
            self.headers,
            &self.body,
            &self.window_secs,
            &self.effects,
            &self.backend_pid,
            &self.claimed_at,
            &self.outermost,
        ];
        if !self.messages.ids.is_empty() {
            params.extend(messages::columns(self.messages));
        }
        params
    }
}

/// How a completion writes the key row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyWrite {
    /// Inserted now: the lookup found no key.
    Insert = 0,
    /// Inserted now over the expired key the lookup found.
    TakeOver = 1,
    /// Updated: [`CLAIM`] inserted it at the start of the request.
    Update = 2,
}

/// Why a key could not be stored (the SQLSTATE `txoutbox_refuse` raised).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The key was claimed in another transaction.
    OtherTransaction,
    /// A concurrent request stored the key first.
    StoredConcurrently,
    /// A savepoint is open where the outermost transaction is needed.
    Savepoint,
    /// A nested transaction was given where the outermost one is needed, and refused before
    /// anything was sent (a driver that knows its transactions' depth: sqlx).
    Nested,
}

impl Refused {
    /// The refusal an error carries, if it is one: `txoutbox_refuse`'s, or the unique violation
    /// of a key inserted meanwhile without the lock.
    pub(crate) fn of(err: &super::driver::StoreError) -> Option<Refused> {
        if let super::driver::StoreError::Refused(refused) = err {
            return Some(*refused);
        }
        match err.code()?.as_str() {
            "TXK01" => Some(Refused::OtherTransaction),
            "TXK02" => Some(Refused::StoredConcurrently),
            "TXK03" => Some(Refused::Savepoint),
            "23505" if err.constraint().as_deref() == Some("txoutbox_idempotency_keys_pkey") => {
                Some(Refused::StoredConcurrently)
            }
            _ => None,
        }
    }
}

/// Stores the key (its response and carried effects) and inserts the other outbox rows in one
/// statement; returns the rows written (a row already enqueued is skipped; `None` if the
/// statement answered no row, which it always does). Fails with a [`Refused`] error when the key
/// cannot be stored.
pub(crate) async fn complete_key(
    tx: &impl TxExecutor,
    complete: &CompleteKey<'_>,
) -> Result<Option<messages::Inserted>> {
    let rows = tx.run(complete.statement(), &complete.params()).await?;
    inserted(&rows)
}

/// [`complete_key`] and a COMMIT in one round trip. The statement is sent first; when it fails
/// the COMMIT finds the transaction aborted and rolls it back, and the connection is left as
/// [`CommitExecutor::rows_then_commit`](super::CommitExecutor::rows_then_commit) says (the
/// statement refuses a savepoint, TXK03). Returns the statement's result and the commit's.
pub(crate) async fn complete_key_and_commit(
    tx: impl super::CommitExecutor,
    complete: &CompleteKey<'_>,
) -> (Result<Option<messages::Inserted>>, Result<()>) {
    let statement = complete.statement();
    let params = statement.bind(&complete.params());
    let (rows, committed) = tx.rows_then_commit(statement.sql, &params).await;
    (rows.and_then(|rows| inserted(&rows)), committed)
}

fn inserted(rows: &[tokio_postgres::Row]) -> Result<Option<messages::Inserted>> {
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let ids: Option<Vec<Uuid>> = row.try_get(0)?;
    let destinations: Option<Vec<String>> = row.try_get(1)?;
    Ok(Some(messages::Inserted {
        ids: ids.unwrap_or_default(),
        destinations: destinations.unwrap_or_default(),
    }))
}

/// What a fan-out did.
#[derive(Debug, Default)]
pub(crate) struct FannedOut {
    /// Keys whose effects it moved.
    pub keys: u64,
    /// Rows it wrote.
    pub rows: u64,
}

/// Moves the effects of up to `limit` keys (or of the key `only`) into `txoutbox_messages`,
/// skipping the keys `skip` (`scope\nkey`).
pub(crate) async fn fan_out(
    conn: &impl TxExecutor,
    limit: i64,
    skip: &[String],
    only: Option<(&str, &str)>,
) -> Result<FannedOut> {
    let (scope, key) = (only.map(|(s, _)| s), only.map(|(_, k)| k));
    let rows = conn.run(FAN_OUT, &[&limit, &skip, &scope, &key]).await?;
    let Some(row) = rows.first() else {
        return Ok(FannedOut::default());
    };
    Ok(FannedOut {
        keys: u64::try_from(row.try_get::<_, i64>(0)?).unwrap_or(0),
        rows: u64::try_from(row.try_get::<_, i64>(1)?).unwrap_or(0),
    })
}

/// The oldest keys (up to `limit`) that still carry effects, but the keys `skip`.
pub(crate) async fn awaiting_fan_out(
    conn: &impl TxExecutor,
    limit: i64,
    skip: &[String],
) -> Result<Vec<(String, String)>> {
    let rows = conn.run(AWAITING_FAN_OUT, &[&limit, &skip]).await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// Deletes up to `batch` expired keys; returns how many.
pub(crate) async fn prune_expired(conn: &impl TxExecutor, batch: i64) -> Result<u64> {
    let rows = conn.run(PRUNE_EXPIRED, &[&batch]).await?;
    Ok(rows.len() as u64)
}
