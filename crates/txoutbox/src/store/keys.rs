//! `txoutbox_idempotency_keys`: claim a key, read a key someone else holds, store the response
//! (with the request's outbox rows), prune expired keys.

use tokio_postgres::types::Type;
use uuid::Uuid;

use super::messages::{self, MessageColumns};
use super::{Result, TxExecutor};

/// Claims a key: inserts it, or takes over an expired one, and returns a row only when the key
/// is now ours. A live key conflicts: the insert waits for a concurrent holder's transaction,
/// bounded by a short lock timeout ($5), and then returns nothing.
///
/// One statement does what would otherwise take three: the `state` expression saves the
/// caller's `lock_timeout` and sets ours before the row is inserted (the wait for a conflicting
/// row happens after the values are computed), and RETURNING restores it once the row is ours.
/// When the key is taken, [`LOOKUP`] restores it; when the wait times out, the transaction is
/// aborted and the setting dies with it. The nesting fixes the evaluation order.
///
/// The second column is the claim's time (`created_at`, microseconds since the epoch): the
/// effects of this claim derive their downstream keys from it, so a new claim of the key
/// after its window (a takeover, or an insert after the pruner removed it) gets new keys.
const CLAIM: &str = "INSERT INTO txoutbox_idempotency_keys \
     (scope, key, fingerprint, state, expires_at) \
     VALUES ($1, $2, $3, \
         CASE WHEN set_config('lock_timeout', CASE WHEN set_config( \
             'txoutbox.saved_lock_timeout', current_setting('lock_timeout'), true) \
             IS NULL THEN $5 ELSE $5 END, true) IS NULL THEN 'in_flight' ELSE 'in_flight' END, \
         now() + make_interval(secs => $4)) \
     ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
         state = 'in_flight', response_status = NULL, response_headers = NULL, \
         response_body = NULL, created_at = now(), expires_at = EXCLUDED.expires_at \
     WHERE txoutbox_idempotency_keys.expires_at <= now() \
     RETURNING set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true), \
         (extract(epoch FROM created_at) * 1000000)::int8";

/// Reads a live key that the claim found taken, restoring the caller's lock timeout.
const LOOKUP: &str = "SELECT fingerprint, state, response_status, response_headers, \
     response_body, set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), \
     true) FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2";

/// Stores the response and writes the request's outbox rows in one statement (it writes
/// `txoutbox_messages` too, in its CTE); returns the ids and destinations of the rows written
/// (NULL when none was: all were already enqueued).
const COMPLETE_WITH_MESSAGES: &str = "WITH messages AS ( \
     INSERT INTO txoutbox_messages \
         (id, destination, payload, headers, downstream_key, ordering_key) \
     SELECT * FROM unnest($6::uuid[], $7::text[], $8::jsonb[], $9::jsonb[], $10::text[], \
         $11::text[]) \
     ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination) \
     UPDATE txoutbox_idempotency_keys SET state = 'completed', response_status = $3, \
         response_headers = $4, response_body = $5 \
     WHERE scope = $1 AND key = $2 \
     RETURNING (SELECT array_agg(id) FROM messages), \
         (SELECT array_agg(destination) FROM messages)";

/// Deletes one bounded batch of expired keys; skips rows a request holds right now.
const PRUNE_EXPIRED: &str = "DELETE FROM txoutbox_idempotency_keys WHERE (scope, key) IN ( \
     SELECT scope, key FROM txoutbox_idempotency_keys WHERE expires_at <= now() \
     ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING 1";

/// The key to claim.
pub(crate) struct ClaimKey<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a [u8],
    /// The key window, in seconds.
    pub window_secs: f64,
    /// The lock timeout while waiting for a concurrent holder, as Postgres reads it (`2000ms`).
    pub lock_timeout: &'a str,
}

/// Claims a key; returns the claim's time (µs since the epoch) when the key is now ours, `None`
/// when a live key holds it. The error of a lock timeout or a serialization failure is the
/// database's, for the caller to read its SQLSTATE.
pub(crate) async fn claim_key(tx: &impl TxExecutor, claim: &ClaimKey<'_>) -> Result<Option<i64>> {
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
    rows.first().map(|row| row.try_get(1)).transpose()
}

/// A key some request claimed, as [`lookup_key`] read it.
pub(crate) struct KeyRow {
    pub fingerprint: Vec<u8>,
    /// `in_flight` or `completed`.
    pub state: String,
    pub response_status: Option<i16>,
    pub response_headers: Option<serde_json::Value>,
    pub response_body: Option<Vec<u8>>,
}

/// Reads the key (scope, key) and restores the caller's lock timeout; `None` when it is gone.
pub(crate) async fn lookup_key(
    tx: &impl TxExecutor,
    scope: &str,
    key: &str,
) -> Result<Option<KeyRow>> {
    let rows = tx
        .rows(LOOKUP, &[(&scope, Type::TEXT), (&key, Type::TEXT)])
        .await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    Ok(Some(KeyRow {
        fingerprint: row.try_get(0)?,
        state: row.try_get(1)?,
        response_status: row.try_get(2)?,
        response_headers: row.try_get(3)?,
        response_body: row.try_get(4)?,
    }))
}

/// The response to store with a claimed key, and the request's outbox rows.
pub(crate) struct CompleteKey<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub status: i16,
    pub headers: &'a serde_json::Value,
    pub body: &'a [u8],
    pub messages: &'a MessageColumns,
}

/// Stores the response and inserts the outbox rows in one statement. `None` when the key is not
/// in this transaction; otherwise the rows written (a row already enqueued is skipped).
pub(crate) async fn complete_key(
    tx: &impl TxExecutor,
    complete: &CompleteKey<'_>,
) -> Result<Option<messages::Inserted>> {
    let mut params: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> = vec![
        (&complete.scope, Type::TEXT),
        (&complete.key, Type::TEXT),
        (&complete.status, Type::INT2),
        (complete.headers, Type::JSONB),
        (&complete.body, Type::BYTEA),
    ];
    params.extend(messages::columns(complete.messages));
    let rows = tx.rows(COMPLETE_WITH_MESSAGES, &params).await?;
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

/// Deletes up to `batch` expired keys; returns how many.
pub(crate) async fn prune_expired(conn: &impl TxExecutor, batch: i64) -> Result<u64> {
    let rows = conn.rows(PRUNE_EXPIRED, &[(&batch, Type::INT8)]).await?;
    Ok(rows.len() as u64)
}
