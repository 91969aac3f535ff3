//! `txoutbox_idempotency_keys`: claim a key, read a key someone else holds, store the response
//! (with the request's outbox rows), prune expired keys.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use uuid::Uuid;

use super::driver::{self, FoundRow, LockRow};
use super::messages::{self, MessageColumns};
use super::{Result, TxExecutor};

/// Takes the key's transaction-scoped advisory lock if no request holds it: the common case,
/// without touching any setting. Every request of a key (scope $1, key $2) takes this lock (or
/// waits for it, [`LOCK_WAIT`]) before anything else, so concurrent requests with one key run one
/// after the other, and the lookup behind the lock sees what the previous holder committed (under
/// READ COMMITTED each statement takes a new snapshot). Returns whether it got the lock, the
/// isolation level, the transaction's time (the claim's time, and the key row's `created_at` when
/// it is written at the end) and the backend's pid (with the time, it tells the transaction the
/// key is later stored in).
pub(super) const LOCK_TRY: &str =
    "SELECT pg_try_advisory_xact_lock(hashtextextended($1 || chr(10) || $2, \
     4411)), current_setting('transaction_isolation'), now(), pg_backend_pid()";

/// [`LOCK_TRY`] when another request holds the lock: waits for it at most $3 (a
/// `lock_timeout`); [`LOOKUP_RESTORE`], sent right behind it, restores the caller's timeout. The
/// `set_config` calls are nested into the lock's argument so that they run before the wait: the
/// caller's timeout is saved, ours set; if the wait times out the transaction is aborted and the
/// setting dies with it.
pub(super) const LOCK_WAIT: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended(CASE WHEN set_config( \
     'lock_timeout', CASE WHEN set_config('txoutbox.saved_lock_timeout', \
         current_setting('lock_timeout'), true) IS NULL THEN $3 ELSE $3 END, true) IS NULL \
     THEN $1 ELSE $1 END || chr(10) || $2, 4411)) IS NULL, \
     current_setting('transaction_isolation'), now(), pg_backend_pid()";

/// Reads the key (scope $1, key $2) behind [`LOCK_TRY`]: no row when there is none; `live` is
/// false for an expired one (the request is new: the key is taken over when it is stored).
pub(super) const LOOKUP: &str =
    "SELECT fingerprint, state, response_status, response_headers::text, \
     response_body, expires_at > now() AS live \
     FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2";

/// [`LOOKUP`] behind [`LOCK_WAIT`], restoring the caller's lock timeout: always one row (the
/// key's columns NULL when there is none).
pub(super) const LOOKUP_RESTORE: &str = "SELECT k.fingerprint, k.state, k.response_status, \
     k.response_headers::text, k.response_body, COALESCE(k.expires_at > now(), false) AS live, \
     set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true) \
     FROM (SELECT 1) AS one LEFT JOIN txoutbox_idempotency_keys k ON k.scope = $1 AND k.key = $2";

/// Inserts the key row at the claim, under REPEATABLE READ and SERIALIZABLE (where the lookup
/// reads the transaction's first snapshot and cannot see a key committed after it): a key
/// committed after the snapshot then refuses the insert with a serialization failure instead of
/// being overlooked. Takes over an expired key, leaving it the effects it still carries (the
/// completion, [`update_key!`], adds this request's). Returns a row only when the key is now ours.
/// The lock timeout is set and restored as in [`LOCK_WAIT`], for a holder that took no advisory
/// lock.
pub(super) const CLAIM: &str = "INSERT INTO txoutbox_idempotency_keys \
     (scope, key, fingerprint, state, expires_at, created_at) \
     VALUES ($1, $2, $3, \
         CASE WHEN set_config('lock_timeout', CASE WHEN set_config( \
             'txoutbox.saved_lock_timeout', current_setting('lock_timeout'), true) \
             IS NULL THEN $5 ELSE $5 END, true) IS NULL THEN 'in_flight' ELSE 'in_flight' END, \
         now() + make_interval(secs => $4), now()) \
     ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
         state = 'in_flight', response_status = NULL, response_headers = NULL, \
         response_body = NULL, created_at = now(), expires_at = EXCLUDED.expires_at \
     WHERE txoutbox_idempotency_keys.expires_at <= now() \
     RETURNING set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true)";

/// The end of the completion statements: one row with the outbox rows written (their ids and
/// destinations, NULL when none was: all were already enqueued, or there were none to write),
/// after the checks that make the statement fail, so that its writes are undone and a COMMIT
/// sent behind it rolls back instead (`txoutbox_refuse`): the key stored in another transaction
/// than its claim's (the claim's backend $9 and time $10), a key stored first by a concurrent
/// request (no row `stored`), and, when $11 asks, a savepoint open (the key row's `xmin` is then
/// a subtransaction's, not the top-level transaction's). `stored` is read once.
macro_rules! complete_tail {
    ($ids:literal, $destinations:literal) => {
        concat!(
            " SELECT ",
            $ids,
            ", ",
            $destinations,
            ", CASE WHEN pg_backend_pid() <> $9 OR now() <> $10 \
                 THEN txoutbox_refuse('TXK01', 'the claimed key is not in this transaction') \
             WHEN s.outermost IS NULL \
                 THEN txoutbox_refuse('TXK02', 'a concurrent request stored the key first') \
             WHEN $11 AND NOT s.outermost \
                 THEN txoutbox_refuse('TXK03', 'Claim::commit was given a transaction with a \
                     savepoint open; complete it and commit the outermost transaction') \
             ELSE 0 END \
             FROM (SELECT bool_and(outermost) AS outermost FROM stored) AS s"
        )
    };
}

/// The outbox rows written with the key ($12..$17), in the statement's first CTE.
macro_rules! complete_messages {
    () => {
        "messages AS ( \
     INSERT INTO txoutbox_messages \
         (id, destination, payload, headers, downstream_key, ordering_key) \
     SELECT * FROM unnest($12::uuid[], $13::text[], $14::jsonb[], $15::jsonb[], $16::text[], \
         $17::text[]) \
     ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination), "
    };
}

/// The key row's columns as a completion writes them: scope $1, key $2, fingerprint $3, the
/// response ($4 status, $5 headers, $6 body), the window $7 (seconds) and the effects it carries
/// ($8, NULL for none).
macro_rules! key_values {
    () => {
        "INSERT INTO txoutbox_idempotency_keys AS k (scope, key, fingerprint, state, \
         response_status, response_headers, response_body, created_at, expires_at, effects) \
     VALUES ($1, $2, $3, 'completed', $4, $5, $6, now(), now() + make_interval(secs => $7), $8)"
    };
}

/// The key row written at the end of the request (READ COMMITTED: the lock of [`LOCK_TRY`]
/// serialises the requests of a key, so this is the key's only write). A plain insert, with no
/// speculative insertion, when the lookup found no key: a key inserted meanwhile by a request
/// that took no lock (a txoutbox before V5) makes it fail with a unique violation.
macro_rules! insert_key {
    () => {
        concat!(
            "stored AS (",
            key_values!(),
            " RETURNING k.xmin = pg_current_xact_id()::xid AS outermost)"
        )
    };
}

/// The key row's effects once a request has stored its own ($8, NULL for none): those of an
/// earlier request of the key, taken over after its window but not fanned out yet, are kept,
/// with this request's after them. Every write of a key row's effects goes through this, so no
/// request's effects are ever written over.
macro_rules! kept_effects {
    () => {
        "CASE WHEN k.effects IS NULL THEN $8::jsonb WHEN $8::jsonb IS NULL THEN k.effects \
             ELSE k.effects || $8::jsonb END"
    };
}

/// [`insert_key!`] over an expired key the lookup found: it is taken over, its effects kept
/// ([`kept_effects!`]). A live key (stored meanwhile by a request that took no lock) is left
/// alone, and the statement refused.
macro_rules! take_over_key {
    () => {
        concat!(
            "stored AS (",
            key_values!(),
            " ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
         state = 'completed', response_status = EXCLUDED.response_status, \
         response_headers = EXCLUDED.response_headers, response_body = EXCLUDED.response_body, \
         created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, effects = ",
            kept_effects!(),
            " WHERE k.expires_at <= now() \
     RETURNING k.xmin = pg_current_xact_id()::xid AS outermost)"
        )
    };
}

/// The key row [`CLAIM`] inserted, given its response and effects (REPEATABLE READ,
/// SERIALIZABLE), with the parameters of [`insert_key!`]. When [`CLAIM`] took over an expired
/// key, the row still carries the effects of the request before, which are kept
/// ([`kept_effects!`]): [`CLAIM`] leaves them alone, and the row is locked from the claim on, so
/// no fan-out empties it in between.
macro_rules! update_key {
    () => {
        concat!(
            "stored AS ( \
     UPDATE txoutbox_idempotency_keys k SET state = 'completed', response_status = $4, \
         response_headers = $5, response_body = $6, effects = ",
            kept_effects!(),
            " WHERE k.scope = $1 AND k.key = $2 \
     RETURNING k.xmin = pg_current_xact_id()::xid AS outermost)"
        )
    };
}

/// A statement that stores a key: alone (no outbox rows to write now, however many effects the
/// key carries: one row written), or with the request's outbox rows.
macro_rules! complete {
    ($key:ident) => {
        concat!(
            "WITH ",
            $key!(),
            complete_tail!("NULL::uuid[]", "NULL::text[]")
        )
    };
    ($key:ident, rows) => {
        concat!(
            "WITH ",
            complete_messages!(),
            $key!(),
            complete_tail!(
                "(SELECT array_agg(id) FROM messages)",
                "(SELECT array_agg(destination) FROM messages)"
            )
        )
    };
}

/// How a key is stored: the statements of each way, without and with outbox rows to write.
const STORE: [(&str, &str); 3] = [
    (complete!(insert_key), complete!(insert_key, rows)),
    (complete!(take_over_key), complete!(take_over_key, rows)),
    (complete!(update_key), complete!(update_key, rows)),
];

/// Moves the effects of up to $1 keys, oldest first, into `txoutbox_messages` (the relay's
/// fan-out, for scopes with deferred effects): one row per effect, due at once, enqueued at the
/// key's time; the keys keep their response and carry no effects any more. Skips keys $2
/// (`scope\nkey`: keys this relay found poisoned) and keys another relay is fanning out; with
/// $3 and $4 set, only that key. An effect whose (destination, downstream key) is already in the
/// hot table is not written twice. Returns how many keys it emptied and how many rows it
/// wrote.
///
/// Its commit does not wait for the WAL flush (`synchronous_commit` off for this statement's
/// transaction alone): a crash can lose the fan-out only whole, and the key rows then still carry
/// the effects, fanned out again. The claim that takes the rows commits with a flush, which
/// makes the fan-out before it durable too (the WAL is flushed in order): no sink is called for a
/// row whose fan-out could still be lost.
const FAN_OUT: &str = "WITH k AS ( \
     SELECT scope, key, effects, created_at FROM txoutbox_idempotency_keys \
     WHERE effects IS NOT NULL AND NOT (scope || chr(10) || key = ANY($2::text[])) \
         AND ($3::text IS NULL OR (scope = $3 AND key = $4)) \
     ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED), \
 written AS ( \
     INSERT INTO txoutbox_messages (id, destination, payload, headers, downstream_key, \
         created_at) \
     SELECT e.id, e.destination, e.payload, COALESCE(e.headers, '{}'), e.downstream_key, \
         k.created_at \
     FROM k CROSS JOIN LATERAL jsonb_to_recordset(k.effects) \
         AS e(id uuid, destination text, payload jsonb, headers jsonb, downstream_key text) \
     ORDER BY k.created_at \
     ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING 1), \
 emptied AS ( \
     UPDATE txoutbox_idempotency_keys t SET effects = NULL FROM k \
     WHERE t.scope = k.scope AND t.key = k.key RETURNING 1) \
 SELECT (SELECT count(*) FROM emptied), (SELECT count(*) FROM written), \
     set_config('synchronous_commit', 'off', true)";

/// The oldest keys (up to $1) that still carry effects, but keys $2 (as in [`FAN_OUT`]).
const AWAITING_FAN_OUT: &str = "SELECT scope, key FROM txoutbox_idempotency_keys \
     WHERE effects IS NOT NULL AND NOT (scope || chr(10) || key = ANY($2::text[])) \
     ORDER BY created_at LIMIT $1";

/// Deletes one bounded batch of expired keys; skips rows a request holds right now, and keys
/// whose effects are not fanned out yet (they would be lost).
const PRUNE_EXPIRED: &str = "DELETE FROM txoutbox_idempotency_keys WHERE (scope, key) IN ( \
     SELECT scope, key FROM txoutbox_idempotency_keys \
     WHERE expires_at <= now() AND effects IS NULL \
     ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING 1";

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
    let key_params = [
        (
            &scope as &(dyn tokio_postgres::types::ToSql + Sync),
            Type::TEXT,
        ),
        (&key, Type::TEXT),
    ];
    let (locked, found) = tx
        .rows_in_order((LOCK_TRY, &key_params), (LOOKUP, &key_params))
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
        let wait_params = [
            (
                &scope as &(dyn tokio_postgres::types::ToSql + Sync),
                Type::TEXT,
            ),
            (&key, Type::TEXT),
            (&lock_timeout, Type::TEXT),
        ];
        let (locked, found) = tx
            .rows_in_order((LOCK_WAIT, &wait_params), (LOOKUP_RESTORE, &key_params))
            .await;
        let locked = locked?;
        let Some(lock) = locked.into_iter().next() else {
            return Ok(None);
        };
        (lock, found?)
    };
    let lock = LockRow {
        isolation: lock.try_get(1)?,
        now: lock.try_get(2)?,
        backend_pid: lock.try_get(3)?,
    };
    let found = match found.first() {
        Some(row) => Some(FoundRow {
            fingerprint: row.try_get(0)?,
            state: row.try_get(1)?,
            response_status: row.try_get(2)?,
            response_headers: row.try_get(3)?,
            response_body: row.try_get(4)?,
            live: row.try_get("live")?,
        }),
        None => None,
    };
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
        .rows(
            CLAIM,
            &[
                (&claim.scope, Type::TEXT),
                (&claim.key, Type::TEXT),
                (&claim.fingerprint, Type::BYTEA),
                (&claim.window_secs, Type::FLOAT8),
                (&claim.lock_timeout, Type::TEXT),
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
    pub(super) fn statement(&self) -> &'static str {
        let (alone, with_rows) = STORE[self.write as usize];
        if self.messages.ids.is_empty() {
            alone
        } else {
            with_rows
        }
    }

    fn params(&self) -> Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> {
        let mut params: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> = vec![
            (&self.scope, Type::TEXT),
            (&self.key, Type::TEXT),
            (&self.fingerprint, Type::BYTEA),
            (&self.status, Type::INT2),
            (self.headers, Type::JSONB),
            (&self.body, Type::BYTEA),
            (&self.window_secs, Type::FLOAT8),
            (&self.effects, Type::JSONB),
            (&self.backend_pid, Type::INT4),
            (&self.claimed_at, Type::TIMESTAMPTZ),
            (&self.outermost, Type::BOOL),
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
    let rows = tx.rows(complete.statement(), &complete.params()).await?;
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
    let (rows, committed) = tx
        .rows_then_commit(complete.statement(), &complete.params())
        .await;
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
    let rows = conn
        .rows(
            FAN_OUT,
            &[
                (&limit, Type::INT8),
                (&skip, Type::TEXT_ARRAY),
                (&scope, Type::TEXT),
                (&key, Type::TEXT),
            ],
        )
        .await?;
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
    let rows = conn
        .rows(
            AWAITING_FAN_OUT,
            &[(&limit, Type::INT8), (&skip, Type::TEXT_ARRAY)],
        )
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// Deletes up to `batch` expired keys; returns how many.
pub(crate) async fn prune_expired(conn: &impl TxExecutor, batch: i64) -> Result<u64> {
    let rows = conn.rows(PRUNE_EXPIRED, &[(&batch, Type::INT8)]).await?;
    Ok(rows.len() as u64)
}
