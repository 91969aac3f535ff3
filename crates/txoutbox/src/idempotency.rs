//! Idempotency keys inside the caller's transaction: claim the key, do the work, store the response,
//! all committed together.
//!
//! What is stored: a handler's 1xx–4xx answers (its business outcomes, such as "insufficient
//! inventory") are stored and replayed to every retry. A 5xx or an error is not stored: the caller
//! rolls the transaction back, so the key, the business rows and the outbox rows all vanish and the
//! retry runs the request again.

pub use crate::downstream_key::{derive_downstream_key, DOWNSTREAM_KEY_NAMESPACE};
pub use crate::key::{KeyError, MAX_KEY_LEN};
pub use crate::store::{CommitExecutor, Params, TxExecutor};
pub use row::{BusinessKey, RowBegin, RowClaim};

mod row;

use std::collections::HashSet;
use std::time::Duration;

use crate::downstream_key::{check_downstream_key, derive_claim_downstream_key};
use crate::key::IdempotencyKey;
use crate::outbox::{check_name, lock_ordering_keys, message_columns, ordering_keys, Enqueued};
use crate::store::driver::{CommitTx, StoreError, WriteTx};
use crate::store::keys;
use crate::telemetry::{
    IDEMPOTENCY_CONFLICTS, IDEMPOTENCY_MISMATCHES, IDEMPOTENCY_REPLAYS, TRACEPARENT,
};
use crate::{
    error::{Error, Result},
    fingerprint::Fingerprint,
    outbox::OutboxMessage,
};

/// The most effects one request stores on its key row in a scope with deferred effects: a
/// request with more writes them all as rows at once, so that a fan-out, which moves the effects
/// of up to 100 keys in one statement, stays a statement of bounded size.
pub const MAX_DEFERRED_EFFECTS: usize = 100;

/// The default key window: a retry within 24 hours of the first request is deduplicated.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a request waits for a concurrent request holding the same key before answering 409.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest window accepted: a shorter one would expire a key before its request commits.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);

/// The longest window accepted (100 years): `now() + window` must stay a valid Postgres
/// timestamp, and no retry comes later than that.
pub const MAX_WINDOW: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The longest lock timeout accepted: a request waits this long for a concurrent holder of its
/// key while holding an HTTP connection and a database connection.
pub const MAX_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// The shortest key [`begin`] accepts by default, in characters. A client's key is the only thing
/// that tells its retries from other clients' requests; a short one can be guessed or collide
/// (draft-ietf-httpapi-idempotency-key-header, Security Considerations). A UUID has 36.
pub const DEFAULT_MIN_KEY_LEN: usize = 16;

/// A key namespace (tenant, account, route) with its own window.
///
/// A key is looked up within its scope only: the same key in two scopes is two requests.
///
/// ```
/// use std::time::Duration;
/// use txoutbox::Scope;
///
/// // Batch clients retry the next day: remember their keys for a week.
/// let scope = Scope::new("invoices")?.with_window(Duration::from_secs(7 * 24 * 3600))?;
/// assert_eq!(scope.name(), "invoices");
/// assert_eq!(scope.window(), Duration::from_secs(7 * 24 * 3600));
/// assert!(Scope::new("").is_err(), "a scope has a name");
/// assert!(Scope::new("x")?.with_window(Duration::ZERO).is_err(), "zero would forget every key");
/// # Ok::<(), txoutbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    name: String,
    window: Duration,
    lock_timeout: Duration,
    min_key_len: usize,
    metric_label: Option<&'static str>,
    deferred_effects: bool,
}

impl Scope {
    /// A scope with the default window (24 h), lock timeout (2 s) and shortest key (16
    /// characters).
    ///
    /// Fails for an empty name, one over 255 bytes, or one with control characters.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        check_name("scope", &name)?;
        Ok(Self {
            name,
            window: DEFAULT_WINDOW,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            min_key_len: DEFAULT_MIN_KEY_LEN,
            metric_label: None,
            deferred_effects: false,
        })
    }

    /// How long a key is remembered. A batch client that retries tomorrow needs a week.
    ///
    /// Fails with [`Error::Config`] for a window shorter than [`MIN_WINDOW`] (zero would forget
    /// every key at once) or longer than [`MAX_WINDOW`] (100 years).
    pub fn with_window(mut self, window: Duration) -> Result<Self> {
        check_window(&format!("scope {:?}", self.name), window)?;
        self.window = window;
        Ok(self)
    }

    /// How long to wait for a concurrent holder of the same key (then [`Begin::InFlight`]).
    ///
    /// Fails with [`Error::Config`] for zero (Postgres reads a `lock_timeout` of 0 as "wait
    /// forever") or more than [`MAX_LOCK_TIMEOUT`] (60 s).
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_lock_timeout(&format!("scope {:?}", self.name), timeout)?;
        self.lock_timeout = timeout;
        Ok(self)
    }

    /// The shortest key [`begin`] accepts in this scope ([`DEFAULT_MIN_KEY_LEN`] by default); a
    /// shorter one is refused with [`KeyError::TooShort`] (400). Lower it for clients that send
    /// short keys of their own design (order numbers); 1 accepts any key.
    ///
    /// Fails with [`Error::Config`] outside `1..=`[`MAX_KEY_LEN`].
    pub fn with_min_key_len(mut self, min: usize) -> Result<Self> {
        if !(1..=MAX_KEY_LEN).contains(&min) {
            return Err(Error::Config(format!(
                "scope {:?}: shortest key length {min} is outside 1..={MAX_KEY_LEN}",
                self.name
            )));
        }
        self.min_key_len = min;
        Ok(self)
    }

    /// The `scope` label of this scope's idempotency metrics (replays, mismatches, conflicts),
    /// instead of its name. For names that carry a tenant or account id (`tenant:42:charges`):
    /// one label value per tenant would grow the metrics without bound. A `&'static str`, so the
    /// label values stay a fixed set.
    pub fn with_metric_label(mut self, label: &'static str) -> Self {
        self.metric_label = Some(label);
        self
    }

    /// Stores each request's effects on its key row, one row per request however many effects,
    /// and lets the relay write them into `txoutbox_messages` in batches, off the request path.
    /// The request then writes one row (its key, response and effects) besides its business rows:
    /// the cheapest write path (README, Performance). What changes: the effects appear in
    /// `txoutbox_messages` (and `txoutbox list`) when a relay fans them out, a few milliseconds
    /// after the commit with a relay running (`txoutbox stats` counts those not yet fanned out),
    /// and a key is not pruned while it still carries effects. Effects with an ordering key or a
    /// downstream key of their own are written as rows at once, as without this option: their
    /// commit order and their deduplication are decided when they are enqueued; so are all the
    /// effects of a request with more than [`MAX_DEFERRED_EFFECTS`].
    pub fn with_deferred_effects(mut self) -> Self {
        self.deferred_effects = true;
        self
    }

    /// Whether the scope's requests store their effects on their key rows
    /// ([`Scope::with_deferred_effects`]).
    pub fn deferred_effects(&self) -> bool {
        self.deferred_effects
    }

    /// The scope's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The scope's key window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How long a request waits for a concurrent holder of its key.
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// The shortest key accepted in this scope, in characters.
    pub fn min_key_len(&self) -> usize {
        self.min_key_len
    }

    /// Refuses a key shorter than the scope's [`Scope::min_key_len`].
    pub fn check_key(&self, key: &IdempotencyKey) -> Result<(), KeyError> {
        let len = key.as_str().len();
        if len < self.min_key_len {
            return Err(KeyError::TooShort {
                len,
                min: self.min_key_len,
            });
        }
        Ok(())
    }
}

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

/// A claimed key: the right to do the request's work once.
///
/// Effects enqueued here are buffered and written by [`Claim::complete`] (or [`Claim::commit`])
/// in the same statement that stores the key and the response, inside the caller's transaction.
/// Each effect has a name unique in the request; its downstream key is derived from the scope,
/// the key and that name, so a sink forwards the same key on every attempt.
///
/// ```no_run
/// use txoutbox::{Begin, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse};
///
/// # async fn handler(client: &mut tokio_postgres::Client) -> Result<(), txoutbox::Error> {
/// let scope = Scope::new("orders")?;
/// let key = IdempotencyKey::from_header("9b3e3c4f-4d1e-4e7a-9d3c-2f0c5a1e8b7d")?;
/// let tx = client.transaction().await?;
/// let fingerprint = Fingerprint::new("POST", "/orders", b"{}");
/// if let Begin::New(mut claim) = txoutbox::begin(&tx, &scope, &key, &fingerprint).await? {
///     let email = serde_json::json!({"to": "buyer@example.com"});
///     claim.enqueue("confirmation", OutboxMessage::new("email", &email)?)?;
///     // What the email sink will forward, the same on every attempt:
///     let _downstream_key: String = claim.downstream_key("confirmation");
///     let created = StoredResponse { status: 201, headers: vec![], body: b"{}".to_vec() };
///     claim.complete(&tx, &created).await?; // the key, the response and the effects
///     tx.commit().await?;
/// }
/// # Ok(())
/// # }
/// ```
///
/// The runnable version, with the retry answered from the stored response, is the crate's
/// `handler` example (`cargo run -p txoutbox --example handler`).
#[derive(Debug)]
pub struct Claim {
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: Vec<u8>,
    /// The claim's time (the transaction's `now()`, which becomes the key row's `created_at`):
    /// in microseconds since the epoch, part of its effects' downstream keys.
    claimed_at: chrono::DateTime<chrono::Utc>,
    /// The claim's backend: the key is stored only in the claim's transaction.
    backend_pid: i32,
    /// How the request's completion writes the key row: inserted (over an expired key, taken
    /// over), or updated when the claim inserted it (REPEATABLE READ, SERIALIZABLE).
    write: keys::KeyWrite,
    messages: Vec<(String, OutboxMessage)>,
    effects: HashSet<String>,
    traceparent: Option<crate::telemetry::Traceparent>,
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

impl Scope {
    /// The `scope` label of this scope's metrics.
    pub(crate) fn metric_label_value(&self) -> metrics::SharedString {
        match self.metric_label {
            Some(label) => metrics::SharedString::const_str(label),
            None => self.name.clone().into(),
        }
    }
}

impl Claim {
    /// Enqueues one effect of this request. Its downstream key is derived from (scope, request
    /// key, `effect`, the claim's time) unless the message carries one; see
    /// [`Claim::downstream_key`]. Each effect name may be used once per request.
    pub fn enqueue(&mut self, effect: &str, message: OutboxMessage) -> Result<&mut Self> {
        check_effect(&mut self.effects, effect)?;
        self.messages.push((effect.to_owned(), message));
        Ok(self)
    }

    /// Attaches the request's W3C trace context to every effect of this request that does not
    /// carry its own `traceparent` (those enqueued before and after this call alike), so the
    /// request's trace reaches all its effects. Fails with [`Error::Invalid`] for a malformed
    /// value; the claim is unchanged then.
    pub fn with_traceparent(&mut self, traceparent: &str) -> Result<&mut Self> {
        self.traceparent = Some(crate::telemetry::Traceparent::parse(traceparent.trim())?);
        Ok(self)
    }

    /// The trace context attached to this request's effects: the one given to
    /// [`Claim::with_traceparent`], or (with the `otel` feature) the context of the `tracing`
    /// span that was current at [`begin`], when it had a valid one.
    pub fn traceparent(&self) -> Option<&crate::telemetry::Traceparent> {
        self.traceparent.as_ref()
    }

    /// The downstream key the effect named `effect` gets in this claim, unless its message
    /// carries its own: `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "{scope}\n{key}\n{effect}\n{claimed_at}")`,
    /// `claimed_at` being the claim's time in microseconds since the Unix epoch. Every attempt
    /// of the effect carries it; a request with the same key after the key's window is a new
    /// claim, and its effects get new keys (they are new effects, not the old ones again).
    pub fn downstream_key(&self, effect: &str) -> String {
        derive_claim_downstream_key(
            self.scope.name(),
            &self.key,
            self.claimed_at.timestamp_micros(),
            effect,
        )
    }

    /// The claimed key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Stores the key with the response and writes the buffered outbox rows, in one statement in
    /// the caller's transaction; the caller then commits. A 5xx (or any status outside
    /// 100..=499) is refused with [`Error::Invalid`]: roll back instead, so the retry runs again.
    /// In a scope with [`Scope::with_deferred_effects`], the effects without an ordering key or a
    /// downstream key of their own are stored on the key row, for the relay to fan out.
    ///
    /// Returns which effects were written and which were skipped because a row with the same
    /// (destination, downstream key) is already in the outbox ([`Enqueued`]): only a message
    /// given its own key with [`OutboxMessage::with_downstream_key`] can collide that way.
    ///
    /// Fails with [`Error::Internal`] in another transaction than the claim's, and with
    /// [`Error::Conflict`] (409) when a request that took no key lock (a txoutbox older than V5
    /// during a rolling upgrade) stored the key first; the transaction is then aborted.
    pub async fn complete(
        mut self,
        mut tx: impl WriteTx,
        response: &StoredResponse,
    ) -> Result<Enqueued> {
        let stored = self.stored(response)?;
        lock_ordering_keys(&mut tx, &stored.rows.ordering_keys).await?;
        let written = tx
            .complete_key(&stored.statement(&self, false))
            .await
            .map_err(refused)?;
        stored.enqueued(written)
    }

    /// [`Claim::complete`] and the commit of `tx` in one round trip: the statement that stores
    /// the key and the COMMIT are sent together. A commit that fails is the database's error, as
    /// `tx.commit()` would give (a serialization failure: [`Error::Conflict`]; a lost
    /// connection: [`Error::StoreUnavailable`], the outcome unknown, as for any commit).
    ///
    /// `tx` must be the outermost transaction, with no savepoint open: the COMMIT ends the
    /// outermost transaction whatever `tx` is. A savepoint (what `transaction()` on a
    /// transaction returns), or a transaction with one open, is refused with [`Error::Internal`].
    /// The refusal, like any failure of the statement (a [`Error::Conflict`]), is known only
    /// once the COMMIT behind it is sent, and that COMMIT then rolls back the whole transaction
    /// on the server, the enclosing transactions' work included. What holds after an error:
    /// - nothing of the transaction is committed, and nothing written later on the connection is
    ///   committed as part of it;
    /// - `tx` outermost: the connection is out of any transaction, ready for the next one (a
    ///   pooled connection goes back to its pool clean);
    /// - `tx` a savepoint: the connection is left inside an aborted transaction, so every
    ///   statement of the enclosing transactions fails (SQLSTATE 25P02, "current transaction is
    ///   aborted") until the outermost one is rolled back (`rollback()` or its drop), which
    ///   leaves the connection clean. The outermost one's `commit()` commits nothing: PostgreSQL
    ///   ends an aborted transaction with a rollback, whatever it is asked (tokio-postgres then
    ///   answers `Ok`).
    ///   An enclosing savepoint's `commit()` and `rollback()` fail: its savepoint is gone.
    ///
    /// An error before the statement and its COMMIT are sent (a status that is not stored, an
    /// ordering key's lock) leaves `tx` to its drop, which rolls back `tx` alone, as for any
    /// transaction.
    pub async fn commit(
        mut self,
        mut tx: impl CommitTx,
        response: &StoredResponse,
    ) -> Result<Enqueued> {
        let stored = self.stored(response)?;
        let ordering = ordering_keys(&stored.rows.ordering_keys);
        if !ordering.is_empty() {
            crate::store::driver::Committing::lock_ordering_keys(&mut tx, &ordering).await?;
        }
        let statement = stored.statement(&self, true);
        let (written, committed) = tx.complete_key_and_commit(&statement).await;
        let written = written.map_err(refused)?;
        committed?;
        stored.enqueued(written)
    }

    /// What storing this claim with `response` writes; takes the claim's buffered messages.
    fn stored<'r>(&mut self, response: &'r StoredResponse) -> Result<Stored<'r>> {
        if !(100..500).contains(&response.status) {
            return Err(Error::Invalid(format!(
                "status {} is not stored: roll the transaction back so the retry runs again",
                response.status
            )));
        }
        let messages = std::mem::take(&mut self.messages);
        let too_many_to_defer = messages.len() > MAX_DEFERRED_EFFECTS;
        let claimed_at_micros = self.claimed_at.timestamp_micros();
        let mut now = Vec::new();
        let mut deferred = Vec::new();
        let mut deferred_ids = Vec::new();
        let mut deferred_destinations = Vec::new();
        for (effect, mut message) in messages {
            if let Some(traceparent) = &self.traceparent {
                attach_traceparent(&mut message, traceparent);
            }
            let key = key_for(&self.scope, &self.key, claimed_at_micros, &effect, &message)?;
            let rows_now = !self.scope.deferred_effects
                || too_many_to_defer
                || message.ordering_key.is_some()
                || message.downstream_key.is_some();
            if rows_now {
                now.push((message, key));
                continue;
            }
            deferred_ids.push(message.id);
            deferred_destinations.push(message.destination.clone());
            // Built by moving the message's parts in: `json!` would copy the payload.
            let mut row = serde_json::Map::with_capacity(5);
            row.insert("id".into(), message.id.to_string().into());
            row.insert("destination".into(), message.destination.into());
            row.insert("payload".into(), message.payload);
            row.insert("headers".into(), serde_json::to_value(message.headers)?);
            row.insert("downstream_key".into(), key.into());
            deferred.push(serde_json::Value::Object(row));
        }
        let rows = message_columns(now.iter().map(|(m, key)| (m, Some(key.clone()))))?;
        Ok(Stored {
            status: response.status as i16,
            headers: serde_json::to_value(&response.headers)?,
            body: &response.body,
            rows,
            effects: (!deferred.is_empty()).then_some(serde_json::Value::Array(deferred)),
            deferred_ids,
            deferred_destinations,
        })
    }
}

/// What a claim stores: its response, the outbox rows written now and the effects the key row
/// carries.
struct Stored<'r> {
    status: i16,
    headers: serde_json::Value,
    body: &'r [u8],
    rows: crate::store::messages::MessageColumns,
    effects: Option<serde_json::Value>,
    deferred_ids: Vec<uuid::Uuid>,
    deferred_destinations: Vec<String>,
}

impl Stored<'_> {
    fn statement<'a>(&'a self, claim: &'a Claim, outermost: bool) -> keys::CompleteKey<'a> {
        keys::CompleteKey {
            scope: &claim.scope.name,
            key: claim.key.as_str(),
            fingerprint: &claim.fingerprint,
            window_secs: claim.scope.window.as_secs_f64(),
            status: self.status,
            headers: &self.headers,
            body: self.body,
            messages: &self.rows,
            effects: self.effects.as_ref(),
            backend_pid: claim.backend_pid,
            claimed_at: claim.claimed_at,
            write: claim.write,
            outermost,
        }
    }

    /// Which effects were written: the rows written now, and every effect the key row carries
    /// (each has a downstream key of this claim's, so none can be a duplicate).
    fn enqueued(&self, written: Option<crate::store::messages::Inserted>) -> Result<Enqueued> {
        let mut written =
            written.ok_or_else(|| Error::Internal("the key's store answered no row".into()))?;
        written.ids.extend(&self.deferred_ids);
        written
            .destinations
            .extend(self.deferred_destinations.iter().cloned());
        crate::outbox::count_enqueued(&written.destinations);
        let mut given = self.rows.ids.clone();
        given.extend(&self.deferred_ids);
        Ok(Enqueued::new(&given, &written.ids))
    }
}

/// The error of a statement that stores a key, with txoutbox's refusals said in words.
fn refused(e: StoreError) -> Error {
    match keys::Refused::of(&e) {
        Some(keys::Refused::OtherTransaction) => Error::Internal(
            "the claimed key is not in this transaction (was it begun on another connection?)"
                .into(),
        ),
        Some(keys::Refused::StoredConcurrently) => Error::Conflict {
            message: "a concurrent request that took no key lock stored this key first; a retry \
                      gets its answer"
                .into(),
            source: e.into_source(),
        },
        Some(keys::Refused::Savepoint) => Error::Internal(
            "Claim::commit was given a savepoint or a transaction with one open, whose COMMIT \
             would end the outer transaction too: the whole transaction was rolled back, and its \
             enclosing transactions refuse every statement until they are rolled back; use \
             Claim::complete, then commit the transaction"
                .into(),
        ),
        Some(keys::Refused::Nested) => Error::Internal(
            "Claim::commit was given a nested transaction (a savepoint), whose COMMIT would end \
             the outer transaction too: refused before anything was sent, so the enclosing \
             transactions are as they were (this one rolls back when dropped); use \
             Claim::complete, then commit the transaction"
                .into(),
        ),
        None => e.into(),
    }
}

/// Checks an effect name and records it in `effects`: each name once per request, never with a
/// newline (the names are joined by newlines where downstream keys are derived).
pub(crate) fn check_effect(effects: &mut HashSet<String>, effect: &str) -> Result<()> {
    check_name("effect name", effect)?;
    if effect.contains('\n') {
        return Err(Error::Invalid(
            "an effect name cannot contain a newline".into(),
        ));
    }
    if !effects.insert(effect.to_owned()) {
        return Err(Error::Invalid(format!(
            "effect {effect:?} was enqueued twice in one request; give each effect its own name"
        )));
    }
    Ok(())
}

/// Gives `message` the request's trace context unless it carries its own.
pub(crate) fn attach_traceparent(
    message: &mut OutboxMessage,
    traceparent: &crate::telemetry::Traceparent,
) {
    message
        .headers
        .entry(TRACEPARENT.to_owned())
        .or_insert_with(|| traceparent.as_str().to_owned());
}

/// The downstream key of an effect enqueued within an idempotent request (claimed at
/// `claimed_at_micros`).
fn key_for(
    scope: &Scope,
    key: &IdempotencyKey,
    claimed_at_micros: i64,
    effect: &str,
    message: &OutboxMessage,
) -> Result<String> {
    downstream_key_for(message, || {
        derive_claim_downstream_key(scope.name(), key, claimed_at_micros, effect)
    })
}

/// The downstream key of an effect: the one its message carries (checked), else `derive()`'s.
pub(crate) fn downstream_key_for(
    message: &OutboxMessage,
    derive: impl FnOnce() -> String,
) -> Result<String> {
    match message.downstream_key() {
        Some(given) => {
            check_downstream_key(given)?;
            Ok(given.to_owned())
        }
        None => Ok(derive()),
    }
}

/// Refuses a key or record window outside [`MIN_WINDOW`]..=[`MAX_WINDOW`]; `owner` names what
/// it is for (`scope "charges"`).
pub(crate) fn check_window(owner: &str, window: Duration) -> Result<()> {
    if window < MIN_WINDOW || window > MAX_WINDOW {
        return Err(Error::Config(format!(
            "{owner}: window {window:?} is outside {MIN_WINDOW:?}..={} days",
            MAX_WINDOW.as_secs() / 86_400
        )));
    }
    Ok(())
}

/// Refuses a lock timeout outside 1 ms..=[`MAX_LOCK_TIMEOUT`] (Postgres reads 0 as "wait
/// forever"); `owner` names what it is for.
pub(crate) fn check_lock_timeout(owner: &str, timeout: Duration) -> Result<()> {
    if timeout < Duration::from_millis(1) || timeout > MAX_LOCK_TIMEOUT {
        return Err(Error::Config(format!(
            "{owner}: lock timeout {timeout:?} is outside 1ms..={MAX_LOCK_TIMEOUT:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
