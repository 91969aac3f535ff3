//! Idempotency keys inside the caller's transaction: claim the key, do the work, store the response,
//! all committed together.
//!
//! What is stored: a handler's 1xx–4xx answers (its business outcomes, such as "insufficient
//! inventory") are stored and replayed to every retry. A 5xx or an error is not stored: the caller
//! rolls the transaction back, so the key, the business rows and the outbox rows all vanish and the
//! retry runs the request again.

use std::collections::HashSet;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use crate::outbox::{
    check_name, derive_claim_downstream_key, key_for, lock_ordering_keys, Enqueued, MessageColumns,
};
use crate::telemetry::{
    IDEMPOTENCY_CONFLICTS, IDEMPOTENCY_MISMATCHES, IDEMPOTENCY_REPLAYS, TRACEPARENT,
};
use crate::{sql, Error, Fingerprint, IdempotencyKey, OutboxMessage, Result, TxExecutor};

/// The default key window: a retry within 24 hours of the first request is deduplicated.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a request waits for a concurrent request holding the same key before answering 409.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// A key namespace (tenant, account, route) with its own window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    name: String,
    window: Duration,
    lock_timeout: Duration,
    metric_label: Option<&'static str>,
}

impl Scope {
    /// A scope with the default window (24 h) and lock timeout (2 s).
    ///
    /// Fails for an empty name, one over 255 bytes, or one with control characters.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        check_name("scope", &name)?;
        Ok(Self {
            name,
            window: DEFAULT_WINDOW,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            metric_label: None,
        })
    }

    /// How long a key is remembered. A batch client that retries tomorrow needs a week.
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How long to wait for a concurrent holder of the same key (then [`Begin::InFlight`]).
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The `scope` label of this scope's idempotency metrics (replays, mismatches, conflicts),
    /// instead of its name. For names that carry a tenant or account id (`tenant:42:charges`):
    /// one label value per tenant would grow the metrics without bound. A `&'static str`, so the
    /// label values stay a fixed set.
    pub fn with_metric_label(mut self, label: &'static str) -> Self {
        self.metric_label = Some(label);
        self
    }

    /// The scope's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The scope's key window.
    pub fn window(&self) -> Duration {
        self.window
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
pub enum Begin {
    /// The key is new (or expired): do the work, enqueue effects, then [`Claim::complete`].
    New(Claim),
    /// The key was completed by an earlier request with the same fingerprint: answer this.
    Replay(StoredResponse),
    /// The key was used for a different request (422 Unprocessable Entity).
    Mismatch,
    /// Another request holds the key right now (409 Conflict). The transaction is aborted:
    /// roll it back.
    InFlight,
}

/// A claimed key: the right to do the request's work once.
///
/// Effects enqueued here are buffered and written by [`Claim::complete`] in the same statement that
/// stores the response, inside the caller's transaction.
#[derive(Debug)]
pub struct Claim {
    scope: Scope,
    key: IdempotencyKey,
    /// The claim's time (the key row's `created_at`, µs since the epoch): part of its effects'
    /// downstream keys.
    claimed_at_micros: i64,
    messages: Vec<(String, OutboxMessage)>,
    effects: HashSet<String>,
    traceparent: Option<crate::Traceparent>,
}

/// The trace context a new claim starts with: the current span's, with the `otel` feature.
fn enqueue_context() -> Option<crate::Traceparent> {
    #[cfg(feature = "otel")]
    return crate::telemetry::current_traceparent();
    #[cfg(not(feature = "otel"))]
    None
}

/// Claims `key` in `scope` inside the caller's transaction.
///
/// The key row is inserted in the transaction, so a concurrent request with the same key waits on
/// its row lock (up to the scope's lock timeout) instead of racing a read. Nothing is visible to
/// others until the caller commits; a rollback or a dropped connection leaves nothing.
pub async fn begin(
    tx: &impl TxExecutor,
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Result<Begin> {
    let timeout = format!("{}ms", scope.lock_timeout.as_millis().max(1));
    let window = scope.window.as_secs_f64();
    let fp: &[u8] = fingerprint.as_bytes();
    // Three statements, pipelined into one round trip: short lock timeout, claim, restore.
    let key_str = key.as_str();
    let claim = tx
        .rows(
            sql::keys::CLAIM,
            &[
                (&scope.name, Type::TEXT),
                (&key_str, Type::TEXT),
                (&fp, Type::BYTEA),
                (&window, Type::FLOAT8),
                (&timeout, Type::TEXT),
            ],
        )
        .await;
    let claimed_at_micros = match claim {
        Ok(rows) => match rows.first() {
            Some(row) => Some(row.try_get::<_, i64>(1)?),
            None => None,
        },
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            count(IDEMPOTENCY_CONFLICTS, scope);
            return Ok(Begin::InFlight);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(claimed_at_micros) = claimed_at_micros {
        return Ok(Begin::New(Claim {
            scope: scope.clone(),
            key: key.clone(),
            claimed_at_micros,
            messages: Vec::new(),
            effects: HashSet::new(),
            traceparent: enqueue_context(),
        }));
    }
    let row = tx
        .rows(
            sql::keys::LOOKUP,
            &[(&scope.name, Type::TEXT), (&key.as_str(), Type::TEXT)],
        )
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Invalid("the key vanished between claim and lookup".into()))?;
    let stored_fp: Vec<u8> = row.try_get(0)?;
    if stored_fp != fp {
        count(IDEMPOTENCY_MISMATCHES, scope);
        return Ok(Begin::Mismatch);
    }
    let state: String = row.try_get(1)?;
    if state != "completed" {
        // Committed without a response (a caller that skipped `complete`): treat as held.
        count(IDEMPOTENCY_CONFLICTS, scope);
        return Ok(Begin::InFlight);
    }
    let status: i16 = row.try_get(2)?;
    let headers: serde_json::Value = row.try_get(3)?;
    let headers: Vec<(String, String)> = serde_json::from_value(headers)?;
    let body: Vec<u8> = row.try_get(4)?;
    count(IDEMPOTENCY_REPLAYS, scope);
    Ok(Begin::Replay(StoredResponse {
        status: u16::try_from(status).unwrap_or(0),
        headers,
        body,
    }))
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
        check_name("effect name", effect)?;
        if effect.contains('\n') {
            return Err(Error::Invalid(
                "an effect name cannot contain a newline".into(),
            ));
        }
        if !self.effects.insert(effect.to_owned()) {
            return Err(Error::Invalid(format!(
                "effect {effect:?} was enqueued twice in one request; give each effect its own name"
            )));
        }
        self.messages.push((effect.to_owned(), message));
        Ok(self)
    }

    /// Attaches the request's W3C trace context to every effect of this request that does not
    /// carry its own `traceparent` (those enqueued before and after this call alike), so the
    /// request's trace reaches all its effects. Fails with [`Error::Invalid`] for a malformed
    /// value; the claim is unchanged then.
    pub fn with_traceparent(&mut self, traceparent: &str) -> Result<&mut Self> {
        self.traceparent = Some(crate::Traceparent::parse(traceparent.trim())?);
        Ok(self)
    }

    /// The trace context attached to this request's effects: the one given to
    /// [`Claim::with_traceparent`], or (with the `otel` feature) the context of the `tracing`
    /// span that was current at [`begin`], when it had a valid one.
    pub fn traceparent(&self) -> Option<&crate::Traceparent> {
        self.traceparent.as_ref()
    }

    /// The downstream key the effect named `effect` gets in this claim, unless its message
    /// carries its own: `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "{scope}\n{key}\n{effect}\n{claimed_at}")`,
    /// `claimed_at` being the claim's time in microseconds since the Unix epoch. Every attempt
    /// of the effect carries it; a request with the same key after the key's window is a new
    /// claim, and its effects get new keys (they are new effects, not the old ones again).
    pub fn downstream_key(&self, effect: &str) -> String {
        derive_claim_downstream_key(self.scope.name(), &self.key, self.claimed_at_micros, effect)
    }

    /// The claimed key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Stores the response and writes the buffered outbox rows, in one statement in the caller's
    /// transaction; the caller then commits. A 5xx (or any status outside 100..=499) is refused
    /// with [`Error::Invalid`]: roll back instead, so the retry runs again.
    ///
    /// Returns which effects were written and which were skipped because a row with the same
    /// (destination, downstream key) is already in the outbox ([`Enqueued`]): only a message
    /// given its own key with [`OutboxMessage::with_downstream_key`] can collide that way.
    pub async fn complete(
        self,
        tx: &impl TxExecutor,
        response: &StoredResponse,
    ) -> Result<Enqueued> {
        if !(100..500).contains(&response.status) {
            return Err(Error::Invalid(format!(
                "status {} is not stored: roll the transaction back so the retry runs again",
                response.status
            )));
        }
        let messages: Vec<(String, OutboxMessage)> = match &self.traceparent {
            None => self.messages,
            Some(traceparent) => self
                .messages
                .into_iter()
                .map(|(effect, mut message)| {
                    message
                        .headers
                        .entry(TRACEPARENT.to_owned())
                        .or_insert_with(|| traceparent.as_str().to_owned());
                    (effect, message)
                })
                .collect(),
        };
        let keyed = messages
            .iter()
            .map(|(effect, message)| {
                Ok((
                    message,
                    Some(key_for(
                        &self.scope,
                        &self.key,
                        self.claimed_at_micros,
                        effect,
                        message,
                    )?),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let rows = MessageColumns::new(keyed.into_iter())?;
        lock_ordering_keys(tx, &rows.ordering_keys).await?;
        let status = response.status as i16;
        let headers = serde_json::to_value(&response.headers)?;
        let updated = tx
            .rows(
                sql::keys::COMPLETE_WITH_MESSAGES,
                &[
                    (&self.scope.name, Type::TEXT),
                    (&self.key.as_str(), Type::TEXT),
                    (&status, Type::INT2),
                    (&headers, Type::JSONB),
                    (&response.body, Type::BYTEA),
                    (&rows.ids, Type::UUID_ARRAY),
                    (&rows.destinations, Type::TEXT_ARRAY),
                    (&rows.payloads, Type::JSONB_ARRAY),
                    (&rows.headers, Type::JSONB_ARRAY),
                    (&rows.downstream_keys, Type::TEXT_ARRAY),
                    (&rows.ordering_keys, Type::TEXT_ARRAY),
                ],
            )
            .await?;
        let Some(row) = updated.first() else {
            return Err(Error::Invalid(
                "the claimed key is not in this transaction (was it begun on another connection?)"
                    .into(),
            ));
        };
        let written: Option<Vec<uuid::Uuid>> = row.try_get(0)?;
        let destinations: Option<Vec<String>> = row.try_get(1)?;
        crate::outbox::count_enqueued(&destinations.unwrap_or_default());
        Ok(Enqueued::new(&rows.ids, &written.unwrap_or_default()))
    }
}
