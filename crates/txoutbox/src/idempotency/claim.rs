//! A claimed key: the effects a request enqueues, and the statement that stores the key, its
//! response and the effects together ([`Claim::complete`], [`Claim::commit`]).

use std::collections::HashSet;

use super::{Scope, StoredResponse, MAX_DEFERRED_EFFECTS};
use crate::downstream_key::{check_downstream_key, derive_claim_downstream_key};
use crate::error::{Error, Result};
use crate::key::IdempotencyKey;
use crate::outbox::OutboxMessage;
use crate::outbox::{check_name, lock_ordering_keys, message_columns, Enqueued};
use crate::store::driver::{CommitTx, Statements, StoreError, WriteTx};
use crate::store::keys;
use crate::telemetry::TRACEPARENT;

/// A claimed key: the right to do the request's work once.
///
/// Effects enqueued here are buffered and written by [`Claim::complete`] (or [`Claim::commit`])
/// in the same statement that stores the key and the response, inside the caller's transaction.
/// Each effect has a name unique in the request; its downstream key is derived from the scope,
/// the key and that name, so a sink forwards the same key on every attempt.
///
/// ```
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
/// # txoutbox_test_support::doc_test(|mut client| async move {
/// #     handler(&mut client).await?;
/// #     handler(&mut client).await?; // a retry: replayed, nothing written
/// #     let counts = txoutbox_test_support::counts(&client).await?;
/// #     assert_eq!((counts.keys, counts.pending), (1, 1));
/// #     Ok(())
/// # });
/// ```
///
/// The runnable version, with the retry answered from the stored response, is the crate's
/// `handler` example (`cargo run -p txoutbox --example handler`).
#[derive(Debug)]
pub struct Claim {
    pub(super) scope: Scope,
    pub(super) key: IdempotencyKey,
    pub(super) fingerprint: Vec<u8>,
    /// The claim's time (the transaction's `now()`, which becomes the key row's `created_at`):
    /// in microseconds since the epoch, part of its effects' downstream keys.
    pub(super) claimed_at: chrono::DateTime<chrono::Utc>,
    /// The claim's backend: the key is stored only in the claim's transaction.
    pub(super) backend_pid: i32,
    /// How the request's completion writes the key row: inserted (over an expired key, taken
    /// over), or updated when the claim inserted it (REPEATABLE READ, SERIALIZABLE).
    pub(super) write: keys::KeyWrite,
    pub(super) messages: Vec<(String, OutboxMessage)>,
    pub(super) effects: HashSet<String>,
    pub(super) traceparent: Option<crate::telemetry::Traceparent>,
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
    /// span that was current at [`begin`](super::begin), when it had a valid one.
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
        let stored = self.stored_and_locked(&mut tx, response).await?;
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
        let stored = self
            .stored_and_locked(&mut tx.statements(), response)
            .await?;
        let statement = stored.statement(&self, true);
        let (written, committed) = tx.complete_key_and_commit(&statement).await;
        let written = written.map_err(refused)?;
        committed?;
        stored.enqueued(written)
    }

    /// [`Claim::stored`], with the ordering keys of its rows locked in `tx`: how both ways of
    /// storing the key start (nothing is locked for a status that is not stored).
    async fn stored_and_locked<'r>(
        &mut self,
        tx: &mut impl Statements,
        response: &'r StoredResponse,
    ) -> Result<Stored<'r>> {
        let stored = self.stored(response)?;
        lock_ordering_keys(tx, &stored.rows.ordering_keys).await?;
        Ok(stored)
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

/// The effects a [`RowClaim`](super::RowClaim) or an [`InboxClaim`](crate::inbox::InboxClaim) buffers
/// until it completes: each named once, with its downstream key (its own, or the one `derive`
/// gives), and the trace context attached to those without their own when they are written.
#[derive(Debug)]
pub(crate) struct Effects {
    messages: Vec<OutboxMessage>,
    names: HashSet<String>,
    traceparent: Option<crate::telemetry::Traceparent>,
}

impl Effects {
    /// None yet, the current trace context to attach ([`super::enqueue_context`]).
    pub(crate) fn new() -> Self {
        Effects {
            messages: Vec::new(),
            names: HashSet::new(),
            traceparent: super::enqueue_context(),
        }
    }

    /// Buffers `message` as the effect named `effect` ([`check_effect`], [`downstream_key_for`]).
    pub(crate) fn push(
        &mut self,
        effect: &str,
        message: OutboxMessage,
        derive: impl FnOnce() -> String,
    ) -> Result<()> {
        check_effect(&mut self.names, effect)?;
        let key = downstream_key_for(&message, derive)?;
        self.messages.push(message.with_downstream_key(key));
        Ok(())
    }

    /// Attaches `traceparent` (a W3C value) to every effect without its own; the effects are
    /// unchanged when it is malformed.
    pub(crate) fn set_traceparent(&mut self, traceparent: &str) -> Result<()> {
        self.traceparent = Some(crate::telemetry::Traceparent::parse(traceparent.trim())?);
        Ok(())
    }

    /// The buffered messages, the trace context attached.
    pub(crate) fn into_messages(mut self) -> Vec<OutboxMessage> {
        if let Some(traceparent) = &self.traceparent {
            for message in &mut self.messages {
                attach_traceparent(message, traceparent);
            }
        }
        self.messages
    }
}
