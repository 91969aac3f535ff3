//! The business row as the key record: no key row at all. The service's own table carries the
//! idempotency key in a `UNIQUE` column and the request's fingerprint beside it; the row the
//! request inserts is the proof that the request ran, and a retry is answered from it.
//!
//! The framework supplies what a hand-written version gets wrong: the wait for a concurrent
//! request with the same key (the unique index makes it wait, then the retry reads the winner's
//! row), the fingerprint check (422), the conflict answer (409), and the effects enqueued with
//! downstream keys derived from (scope, key, effect) in the same transaction.
//!
//! The key lives as long as the row: there is no window and nothing to prune, and a key is never
//! new again while its row exists. Effects derive their downstream keys from the key alone, so a
//! replayed request never enqueues them twice.

use tokio_postgres::Row;

use super::{count, Effects, Scope};
use crate::downstream_key::derive_downstream_key;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::outbox::{enqueue, Enqueued, OutboxMessage};
use crate::store::driver::{BusinessRows, StoreError, StoreResult, WriteTx};
use crate::store::{Params, TxExecutor};
use crate::telemetry::{IDEMPOTENCY_CONFLICTS, IDEMPOTENCY_MISMATCHES, IDEMPOTENCY_REPLAYS};

/// A table of the service's whose rows are their requests' key records.
///
/// ```
/// use txoutbox::idempotency::{BusinessKey, RowBegin};
/// use txoutbox::{Fingerprint, IdempotencyKey, OutboxMessage, Scope};
/// use tokio_postgres::types::Type;
///
/// # async fn handler(tx: &tokio_postgres::Transaction<'_>, key: IdempotencyKey, body: &[u8])
/// #     -> Result<(), txoutbox::Error> {
/// // CREATE TABLE charges (id bigserial PRIMARY KEY, amount bigint NOT NULL,
/// //     idempotency_key text NOT NULL UNIQUE, request_fingerprint bytea NOT NULL);
/// let charges = BusinessKey::new(
///     Scope::new("charges")?,
///     "SELECT * FROM charges WHERE idempotency_key = $1",
///     "request_fingerprint",
/// );
/// let fingerprint = Fingerprint::new("POST", "/charge", body);
/// let amount: i64 = 100;
/// let stored: &[u8] = fingerprint.as_bytes();
/// let begun = charges
///     .begin(
///         tx,
///         &key,
///         &fingerprint,
///         "INSERT INTO charges (amount, idempotency_key, request_fingerprint) \
///          VALUES ($1, $2, $3) ON CONFLICT (idempotency_key) DO NOTHING RETURNING *",
///         &[
///             (&amount, Type::INT8),
///             (&key.as_str(), Type::TEXT),
///             (&stored, Type::BYTEA),
///         ],
///     )
///     .await?;
/// match begun {
///     RowBegin::New { row, mut claim } => {
///         claim.enqueue("receipt", OutboxMessage::new("email", &serde_json::json!({"to": "a@b.c"}))?)?;
///         claim.complete(tx).await?;
///         // commit, then answer 201 from `row`
///     }
///     RowBegin::Replay(row) => { /* answer from the first request's row */ }
///     RowBegin::Mismatch => { /* 422 */ }
///     RowBegin::InFlight => { /* roll back, 409 */ }
/// }
/// # Ok(())
/// # }
/// # txoutbox_test_support::doc_test(|mut client| async move {
/// #     client.batch_execute("CREATE TABLE charges (id bigserial PRIMARY KEY, \
/// #         amount bigint NOT NULL, idempotency_key text NOT NULL UNIQUE, \
/// #         request_fingerprint bytea NOT NULL)").await?;
/// #     let key = IdempotencyKey::from_header("9b3e3c4f-4d1e-4e7a-9d3c-2f0c5a1e8b7d")?;
/// #     for _ in 0..2 {
/// #         let tx = client.transaction().await?;
/// #         handler(&tx, key.clone(), b"{}").await?;
/// #         tx.commit().await?;
/// #     }
/// #     let charges: i64 = client.query_one("SELECT count(*) FROM charges", &[]).await?.get(0);
/// #     assert_eq!((charges, txoutbox_test_support::counts(&client).await?.pending), (1, 1));
/// #     Ok(())
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct BusinessKey {
    scope: Scope,
    lookup: &'static str,
    fingerprint_column: &'static str,
}

/// What [`BusinessKey::begin`] found.
#[derive(Debug)]
// Matched once per request, at once: boxing the claim would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
///
/// `R` is the driver's row: `tokio_postgres::Row`, or `sqlx::postgres::PgRow` from
/// [`BusinessKey::begin_sqlx`].
pub enum RowBegin<R = Row> {
    /// The insert wrote the row: this request is the first with its key. Enqueue its effects on
    /// the claim, [`RowClaim::complete`], then commit.
    New {
        /// The row the insert returned.
        row: R,
        /// Where this request's effects are enqueued.
        claim: RowClaim,
    },
    /// A row with this key exists, from a request with the same fingerprint: answer from it.
    Replay(R),
    /// A row with this key exists, from a different request: 422.
    Mismatch,
    /// The insert could not wait for a concurrent request with the same key (its `lock_timeout`
    /// ran out, or a serialization failure or deadlock under a stricter isolation level): roll
    /// back and answer 409; the retry is answered from the winner's row.
    InFlight,
}

impl BusinessKey {
    /// A table whose rows are their requests' key records. `lookup` reads the row of a key
    /// (given as `$1`, text); `fingerprint_column` names its column holding the request's
    /// [`Fingerprint`] (`bytea`). The scope names the effects' downstream keys and the metrics;
    /// its window does not apply (the key lives as long as its row).
    pub fn new(scope: Scope, lookup: &'static str, fingerprint_column: &'static str) -> Self {
        Self {
            scope,
            lookup,
            fingerprint_column,
        }
    }

    /// Runs `insert` (the service's own `INSERT … ON CONFLICT (key column) DO NOTHING
    /// RETURNING …`, storing the key and the fingerprint) in the caller's transaction.
    ///
    /// A row returned means the request is new. No row means the key is taken: the insert has
    /// waited for a concurrent request holding it (bounded by the transaction's `lock_timeout`)
    /// and found it committed, so the row is read with `lookup` and its fingerprint compared.
    pub async fn begin(
        &self,
        tx: &impl TxExecutor,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        insert: &'static str,
        params: Params<'_>,
    ) -> Result<RowBegin> {
        self.scope.check_key(key)?;
        let inserted = tx.rows(insert, params).await.map_err(StoreError::from);
        self.decide(tx, key, fingerprint, inserted).await
    }

    /// [`BusinessKey::begin`] in a sqlx transaction (`&mut tx` or `&mut *tx` of a
    /// `sqlx::Transaction<'_, Postgres>`): `insert` is the service's query with its values bound
    /// (`sqlx::query("INSERT … RETURNING *").bind(…)`); `lookup` is run with the key bound as `$1`.
    #[cfg(feature = "sqlx")]
    pub async fn begin_sqlx(
        &self,
        conn: &mut sqlx::PgConnection,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        insert: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<RowBegin<sqlx::postgres::PgRow>> {
        self.scope.check_key(key)?;
        let inserted = insert.fetch_all(&mut *conn).await.map_err(StoreError::Sqlx);
        self.decide(conn, key, fingerprint, inserted).await
    }

    /// What the insert's answer says, with the lookup behind it when it wrote no row.
    async fn decide<D: BusinessRows>(
        &self,
        mut tx: D,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        inserted: StoreResult<Vec<D::Row>>,
    ) -> Result<RowBegin<D::Row>> {
        let inserted = match inserted {
            Ok(rows) => rows,
            Err(e) if e.held_elsewhere() => {
                count(IDEMPOTENCY_CONFLICTS, &self.scope);
                return Ok(RowBegin::InFlight);
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(row) = inserted.into_iter().next() {
            return Ok(RowBegin::New {
                row,
                claim: RowClaim {
                    scope: self.scope.clone(),
                    key: key.clone(),
                    effects: Effects::new(),
                },
            });
        }
        let key_text = key.as_str();
        let found = match tx.lookup(self.lookup, key_text).await {
            Ok(rows) => rows,
            Err(e) if e.held_elsewhere() => {
                count(IDEMPOTENCY_CONFLICTS, &self.scope);
                return Ok(RowBegin::InFlight);
            }
            Err(e) => return Err(e.into()),
        };
        let Some(row) = found.into_iter().next() else {
            // The insert conflicted, yet no row has the key: the conflict was on another unique
            // constraint, or the row was deleted since. Nothing decided; a retry runs again.
            return Err(Error::conflict(format!(
                "the insert of key {key_text:?} conflicted but the lookup found no row with it"
            )));
        };
        let stored = D::fingerprint(&row, self.fingerprint_column)?;
        if stored != fingerprint.as_bytes() {
            count(IDEMPOTENCY_MISMATCHES, &self.scope);
            return Ok(RowBegin::Mismatch);
        }
        count(IDEMPOTENCY_REPLAYS, &self.scope);
        Ok(RowBegin::Replay(row))
    }
}

/// The effects of a request whose business row is its key record.
#[derive(Debug)]
pub struct RowClaim {
    scope: Scope,
    key: IdempotencyKey,
    effects: Effects,
}

impl RowClaim {
    /// Enqueues one effect of this request, its downstream key derived from (scope, key,
    /// `effect`) unless the message carries one. Each effect name may be used once.
    pub fn enqueue(&mut self, effect: &str, message: OutboxMessage) -> Result<&mut Self> {
        let derive = || derive_downstream_key(self.scope.name(), &self.key, effect);
        self.effects.push(effect, message, derive)?;
        Ok(self)
    }

    /// The downstream key the effect named `effect` gets: `UUIDv5(DOWNSTREAM_KEY_NAMESPACE,
    /// "{scope}\n{key}\n{effect}")`, as [`derive_downstream_key`].
    pub fn downstream_key(&self, effect: &str) -> String {
        derive_downstream_key(self.scope.name(), &self.key, effect)
    }

    /// Attaches the request's W3C trace context to every effect that does not carry its own
    /// `traceparent`, as [`crate::Claim::with_traceparent`] does.
    pub fn with_traceparent(&mut self, traceparent: &str) -> Result<&mut Self> {
        self.effects.set_traceparent(traceparent)?;
        Ok(self)
    }

    /// Writes the buffered effects in the caller's transaction; the caller then commits.
    pub async fn complete(self, tx: impl WriteTx) -> Result<Enqueued> {
        enqueue(tx, &self.effects.into_messages()).await
    }
}
