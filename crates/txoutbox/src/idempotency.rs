//! Idempotency keys inside the caller's transaction: claim the key, do the work, store the response,
//! all committed together.
//!
//! What is stored: a handler's 1xx–4xx answers (its business outcomes, such as "insufficient
//! inventory") are stored and replayed to every retry. A 5xx or an error is not stored: the caller
//! rolls the transaction back, so the key, the business rows and the outbox rows all vanish and the
//! retry runs the request again.
//!
//! Layout: this file holds [`begin`] and its answers ([`Begin`], [`StoredResponse`]); `claim.rs`
//! the claimed key ([`Claim`]: its effects and the statement that stores them with the key);
//! `scope.rs` key scopes ([`Scope`]) and the limits of windows and lock timeouts; `row.rs` keys
//! kept on the business row ([`BusinessKey`]).

pub use crate::downstream_key::{derive_downstream_key, DOWNSTREAM_KEY_NAMESPACE};
pub use crate::key::{KeyError, MAX_KEY_LEN};
pub use crate::store::{CommitExecutor, Params, TxExecutor};
pub use claim::Claim;
pub use row::{BusinessKey, RowBegin, RowClaim};
pub use scope::{
    Scope, DEFAULT_LOCK_TIMEOUT, DEFAULT_MIN_KEY_LEN, DEFAULT_WINDOW, MAX_DEFERRED_EFFECTS,
    MAX_LOCK_TIMEOUT, MAX_WINDOW, MIN_WINDOW,
};

mod claim;
mod row;
mod scope;

use std::collections::HashSet;

pub(crate) use claim::Effects;
pub(crate) use scope::{check_lock_timeout, check_window};

use crate::key::IdempotencyKey;
use crate::store::driver::WriteTx;
use crate::store::keys;
use crate::telemetry::{IDEMPOTENCY_CONFLICTS, IDEMPOTENCY_MISMATCHES, IDEMPOTENCY_REPLAYS};
use crate::{
    error::{Error, Result},
    fingerprint::Fingerprint,
};

/// A response as stored with its key and replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status (100..=499; 5xx answers are never stored).
    pub status: u16,
    /// Header name/value pairs, in order, repeats kept.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// The outcome of [`begin`].
#[derive(Debug)]
#[must_use = "a New claim must be completed with Claim::complete before commit"]
// Matched once per request, at once: boxing the claim would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
pub enum Begin {
    /// The key is new (or expired): do the work, enqueue effects, then [`Claim::complete`].
    New(Claim),
    /// The key was completed by an earlier request with the same fingerprint: answer this.
    Replay(StoredResponse),
    /// The key was used for a different request (422 Unprocessable Content).
    Mismatch,
    /// Another request holds the key right now, or (REPEATABLE READ, SERIALIZABLE) a concurrent
    /// request with the key committed after this transaction's snapshot was taken (409
    /// Conflict). The transaction is aborted: roll it back; a retry after `Retry-After` gets
    /// the stored answer.
    InFlight,
}

/// The trace context a new claim starts with: the current span's, with the `otel` feature.
pub(crate) fn enqueue_context() -> Option<crate::telemetry::Traceparent> {
    #[cfg(feature = "otel")]
    return crate::telemetry::current_traceparent();
    #[cfg(not(feature = "otel"))]
    None
}

/// Claims `key` in `scope` inside the caller's transaction.
///
/// Every request of a key first takes the key's transaction-scoped advisory lock, so a concurrent
/// request with the same key waits for it (up to the scope's lock timeout) instead of racing a
/// read, and then reads what the first one committed. Under READ COMMITTED (the default) the key
/// row is written once, at the end, by [`Claim::complete`]; under REPEATABLE READ or SERIALIZABLE
/// it is inserted here, so that a key committed by a concurrent request after this transaction's
/// snapshot makes Postgres refuse the claim with a serialization failure (40001), which is
/// answered [`Begin::InFlight`], as is a deadlock (40P01). A serialization failure later in the
/// transaction (the caller's own statements, [`Claim::complete`], the commit) is
/// [`Error::Conflict`], also a 409. Nothing is visible to others until the caller commits; a
/// rollback or a dropped connection leaves nothing.
///
/// A key shorter than the scope's [`Scope::min_key_len`] is refused with
/// [`KeyError::TooShort`] before anything is written.
pub async fn begin(
    mut tx: impl WriteTx,
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Result<Begin> {
    scope.check_key(key)?;
    let timeout = format!("{}ms", scope.lock_timeout.as_millis().max(1));
    let fp: &[u8] = fingerprint.as_bytes();
    let locked = match tx
        .lock_and_lookup(&scope.name, key.as_str(), &timeout)
        .await
    {
        Ok(Some(locked)) => locked,
        Ok(None) => return Err(Error::Internal("the key's lookup answered no row".into())),
        Err(e) if e.held_elsewhere() => return Ok(in_flight(scope)),
        Err(e) => return Err(e.into()),
    };
    if let Some(row) = locked.key {
        return answer(scope, key, fp, row);
    }
    let write = if !locked.read_committed {
        keys::KeyWrite::Update
    } else if locked.expired {
        keys::KeyWrite::TakeOver
    } else {
        keys::KeyWrite::Insert
    };
    if write == keys::KeyWrite::Update {
        let claim = keys::ClaimKey {
            scope: &scope.name,
            key: key.as_str(),
            fingerprint: fp,
            window_secs: scope.window.as_secs_f64(),
            lock_timeout: &timeout,
        };
        match tx.claim_key(&claim).await {
            Ok(true) => {}
            Err(e) if !e.held_elsewhere() => return Err(e.into()),
            // Held elsewhere, or a live key this transaction's snapshot could not see, held
            // without the lock.
            _ => return Ok(in_flight(scope)),
        }
    }
    Ok(Begin::New(Claim {
        scope: scope.clone(),
        key: key.clone(),
        fingerprint: fp.to_vec(),
        claimed_at: locked.now,
        backend_pid: locked.backend_pid,
        write,
        messages: Vec::new(),
        effects: HashSet::new(),
        traceparent: enqueue_context(),
    }))
}

/// The answer to a request whose key is stored: its response, a mismatch, or in flight.
fn answer(
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: &[u8],
    row: keys::KeyRow,
) -> Result<Begin> {
    if row.fingerprint != fingerprint {
        count(IDEMPOTENCY_MISMATCHES, scope);
        return Ok(Begin::Mismatch);
    }
    let (true, Some(status), Some(headers), Some(body)) = (
        row.state == "completed",
        row.response_status,
        row.response_headers,
        row.response_body,
    ) else {
        // Committed without a response (a caller that skipped `complete`): treat as held.
        return Ok(in_flight(scope));
    };
    let headers: Vec<(String, String)> = serde_json::from_str(&headers).map_err(|e| {
        Error::undecodable(
            format!(
                "the stored response headers of key {:?} in scope {:?} are not a JSON array of \
                 [name, value] pairs ({e}); the key row was written by another program or by hand",
                key.as_str(),
                scope.name
            ),
            e,
        )
    })?;
    count(IDEMPOTENCY_REPLAYS, scope);
    Ok(Begin::Replay(StoredResponse {
        status: u16::try_from(status).unwrap_or(0),
        headers,
        body,
    }))
}

/// A key another request holds (counted as a conflict).
fn in_flight(scope: &Scope) -> Begin {
    count(IDEMPOTENCY_CONFLICTS, scope);
    Begin::InFlight
}

fn count(name: &'static str, scope: &Scope) {
    metrics::counter!(name, "scope" => scope.metric_label_value()).increment(1);
}

#[cfg(test)]
mod tests;
