//! The driver seam of the write path: the statements a request runs in the caller's transaction
//! (the key's lock and lookup, the key's writes, the enqueue, the ordering-key locks, the
//! wake-up hint, the commit), as typed calls that each driver implements over the same statement
//! text, answering the library's own rows. The relay, the admin commands and the dashboard run
//! on the library's own tokio-postgres connections and stay outside it.
//!
//! Two public traits name what a caller may pass: [`WriteTx`] (a transaction the write path
//! runs statements in) and [`CommitTx`] (one it may also commit, for `Claim::commit`). Their
//! methods live on the sealed traits [`Statements`] and [`Committing`], so that the statements
//! and rows stay inside the crate: a driver is added here, beside `tokio_postgres` (any
//! [`TxExecutor`]) and `sqlx` (the `sqlx` feature), and runs the conformance suite.

use std::future::Future;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use super::columns::Column;
use super::inbox::{self, FoundRecord, Record};
use super::keys::{self, ClaimKey, CompleteKey, Locked, Refused};
use super::messages::{self, Inserted, MessageColumns};
use super::{CommitExecutor, TxExecutor};

/// A statement's failure, from whichever driver ran it.
#[derive(Debug)]
pub enum StoreError {
    /// tokio-postgres's.
    Postgres(tokio_postgres::Error),
    /// sqlx's.
    #[cfg(feature = "sqlx")]
    Sqlx(sqlx::Error),
    /// Refused by txoutbox before anything was sent.
    Refused(Refused),
}

/// What a statement of the seam returns.
pub type StoreResult<T> = std::result::Result<T, StoreError>;

impl StoreError {
    /// The driver's error, as the source of the library's error; none for a refusal of
    /// txoutbox's own made before anything was sent.
    pub(crate) fn into_source(self) -> Option<Box<dyn std::error::Error + Send + Sync + 'static>> {
        match self {
            StoreError::Postgres(e) => Some(Box::new(e)),
            #[cfg(feature = "sqlx")]
            StoreError::Sqlx(e) => Some(Box::new(e)),
            StoreError::Refused(_) => None,
        }
    }

    /// The SQLSTATE of the server's answer, if it is one.
    pub(crate) fn code(&self) -> Option<String> {
        match self {
            StoreError::Postgres(e) => e.code().map(|c| c.code().to_owned()),
            #[cfg(feature = "sqlx")]
            StoreError::Sqlx(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
            _ => None,
        }
    }

    /// The constraint the server's answer names, if any.
    pub(crate) fn constraint(&self) -> Option<String> {
        match self {
            StoreError::Postgres(e) => e.as_db_error()?.constraint().map(str::to_owned),
            #[cfg(feature = "sqlx")]
            StoreError::Sqlx(sqlx::Error::Database(db)) => db.constraint().map(str::to_owned),
            _ => None,
        }
    }

    /// A wait for a key that the transaction gave up (lock timeout) or lost (serialization
    /// failure, deadlock): the transaction is aborted, and the request is answered 409.
    pub(crate) fn held_elsewhere(&self) -> bool {
        matches!(self.code().as_deref(), Some("55P03" | "40001" | "40P01"))
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Postgres(e)
    }
}

impl From<StoreError> for crate::Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Postgres(e) => e.into(),
            #[cfg(feature = "sqlx")]
            StoreError::Sqlx(e) => super::sqlx_driver::error(e),
            StoreError::Refused(refused) => {
                crate::Error::Internal(format!("refused before anything was sent: {refused:?}"))
            }
        }
    }
}

/// The row of `idempotency_keys/lock_try.sql` or `idempotency_keys/lock_wait.sql`, decoded (by any driver).
pub struct LockRow {
    /// `transaction_isolation`.
    pub isolation: String,
    /// The transaction's time.
    pub now: DateTime<Utc>,
    /// The backend's pid.
    pub backend_pid: i32,
}

/// The row of `idempotency_keys/lookup.sql` or `idempotency_keys/lookup_restore.sql`, decoded (by any driver); every column may be
/// NULL (`idempotency_keys/lookup_restore.sql` answers a row of NULLs when there is no key).
pub struct FoundRow {
    pub fingerprint: Option<Vec<u8>>,
    pub state: Option<String>,
    pub response_status: Option<i16>,
    /// As stored JSON text: decoded by the caller, so a row this build cannot decode fails its
    /// own request, not the lookup.
    pub response_headers: Option<String>,
    pub response_body: Option<Vec<u8>>,
    pub live: Option<bool>,
}

impl LockRow {
    /// Decodes a lock's row (its first column, whether the lock was taken, is read apart).
    pub(crate) fn decode<R>(row: &R) -> Result<Self, R::Error>
    where
        R: Column<String> + Column<DateTime<Utc>> + Column<i32>,
    {
        Ok(LockRow {
            isolation: row.column(1)?,
            now: row.column(2)?,
            backend_pid: row.column(3)?,
        })
    }
}

impl FoundRow {
    /// Decodes a lookup's row.
    pub(crate) fn decode<R>(row: &R) -> Result<Self, R::Error>
    where
        R: Column<Option<Vec<u8>>> + Column<Option<String>> + Column<Option<i16>>,
        R: Column<Option<bool>>,
    {
        Ok(FoundRow {
            fingerprint: row.column(0)?,
            state: row.column(1)?,
            response_status: row.column(2)?,
            response_headers: row.column(3)?,
            response_body: row.column(4)?,
            live: row.column(5)?,
        })
    }
}

/// What the lock and the lookup behind it say, whichever driver read them.
pub(crate) fn locked(lock: LockRow, found: Option<FoundRow>) -> Locked {
    let found = found.filter(|row| row.fingerprint.is_some());
    let live = found.as_ref().and_then(|row| row.live).unwrap_or(false);
    let expired = found.is_some() && !live;
    let key = match found {
        Some(row) if live => Some(keys::KeyRow {
            fingerprint: row.fingerprint.unwrap_or_default(),
            // A key row without a state is answered as held (not `completed`).
            state: row.state.unwrap_or_default(),
            response_status: row.response_status,
            response_headers: row.response_headers,
            response_body: row.response_body,
        }),
        _ => None,
    };
    Locked {
        read_committed: lock.isolation == "read committed",
        now: lock.now,
        backend_pid: lock.backend_pid,
        key,
        expired,
    }
}

/// A caller's transaction the write path runs its statements in: `&tokio_postgres::Transaction`,
/// `&deadpool_postgres::Transaction` (any `&T` where `T:` [`TxExecutor`]), and with the `sqlx`
/// feature `&mut sqlx::Transaction<'_, Postgres>` and `&mut sqlx::PgConnection` (a connection
/// inside a transaction). Passed by value: `begin(&tx, …)` on tokio-postgres, `begin(&mut tx, …)`
/// on sqlx.
///
/// Sealed: the drivers are txoutbox's own (each runs the conformance suite); it cannot be
/// implemented outside this crate.
pub trait WriteTx: Statements {}

impl<T: Statements> WriteTx for T {}

/// A caller's transaction the write path may also commit ([`crate::Claim::commit`]):
/// `tokio_postgres::Transaction`, `deadpool_postgres::Transaction` (any [`CommitExecutor`]), and
/// with the `sqlx` feature `sqlx::Transaction<'_, Postgres>`. Passed by value: it is consumed.
///
/// Sealed, as [`WriteTx`] is.
pub trait CommitTx: Committing {
    /// Commits the transaction: what a handler generic over the driver calls (on a concrete
    /// transaction its own `commit()` is the same).
    fn commit(self) -> impl Future<Output = crate::Result<()>> + Send {
        async move { Ok(self.commit_tx().await?) }
    }

    /// Rolls the transaction back.
    fn rollback(self) -> impl Future<Output = crate::Result<()>> + Send {
        async move { Ok(self.rollback_tx().await?) }
    }
}

impl<T: Committing> CommitTx for T {}

/// The write path's statements, as one driver runs them (sealed: see the module's docs).
pub trait Statements: Send {
    /// The key's lock and the lookup behind it ([`keys::lock_and_lookup`]).
    fn lock_and_lookup<'a>(
        &'a mut self,
        scope: &'a str,
        key: &'a str,
        lock_timeout: &'a str,
    ) -> impl Future<Output = StoreResult<Option<Locked>>> + Send + 'a;

    /// The key row inserted at the claim (REPEATABLE READ, SERIALIZABLE): true when it is ours.
    fn claim_key<'a>(
        &'a mut self,
        claim: &'a ClaimKey<'a>,
    ) -> impl Future<Output = StoreResult<bool>> + Send + 'a;

    /// The key stored with its response and the request's outbox rows, in one statement.
    fn complete_key<'a>(
        &'a mut self,
        complete: &'a CompleteKey<'a>,
    ) -> impl Future<Output = StoreResult<Option<Inserted>>> + Send + 'a;

    /// Outbox rows inserted outside a claim ([`crate::enqueue`], `BusinessKey`).
    fn insert_messages<'a>(
        &'a mut self,
        rows: &'a MessageColumns,
    ) -> impl Future<Output = StoreResult<Inserted>> + Send + 'a;

    /// The ordering keys' transaction-scoped locks, in a fixed order.
    fn lock_ordering_keys<'a>(
        &'a mut self,
        keys: &'a [&'a str],
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a;

    /// The relays' wake-up hint, delivered at commit.
    fn notify(&mut self) -> impl Future<Output = StoreResult<()>> + Send + '_;

    /// An inbox record written ([`inbox::write`]): its time when it is new, `None` when a
    /// record holds the message id (an insert) or a concurrent delivery took it over first (a
    /// take-over).
    fn inbox_write<'a>(
        &'a mut self,
        record: &'a Record<'a>,
        write: inbox::Write,
    ) -> impl Future<Output = StoreResult<Option<DateTime<Utc>>>> + Send + 'a;

    /// The record that holds a message id ([`statements::inbox::LOOKUP`](super::statements::inbox::LOOKUP)), restoring the lock timeout.
    fn inbox_lookup<'a>(
        &'a mut self,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = StoreResult<Option<FoundRecord>>> + Send + 'a;
}

/// A driver's part in `BusinessKey`: the service's own lookup of a key's row, and the
/// fingerprint column of its rows (sealed).
pub trait BusinessRows: Statements {
    /// The driver's row.
    type Row: Send;

    /// Runs the service's `lookup` with `key` as `$1` (text).
    fn lookup<'a>(
        &'a mut self,
        lookup: &'static str,
        key: &'a str,
    ) -> impl Future<Output = StoreResult<Vec<Self::Row>>> + Send + 'a;

    /// The request fingerprint the row holds in `column` (bytea).
    fn fingerprint(row: &Self::Row, column: &str) -> StoreResult<Vec<u8>>;
}

impl<T: TxExecutor> BusinessRows for &T {
    type Row = tokio_postgres::Row;

    fn lookup<'a>(
        &'a mut self,
        lookup: &'static str,
        key: &'a str,
    ) -> impl Future<Output = StoreResult<Vec<Self::Row>>> + Send + 'a {
        let tx: &'a T = self;
        async move {
            let params = [(
                &key as &(dyn tokio_postgres::types::ToSql + Sync),
                tokio_postgres::types::Type::TEXT,
            )];
            Ok(tx.rows(lookup, &params).await?)
        }
    }

    fn fingerprint(row: &Self::Row, column: &str) -> StoreResult<Vec<u8>> {
        Ok(row.try_get(column)?)
    }
}

/// What committing the caller's transaction takes, as one driver does it (sealed).
pub trait Committing: Send + Sized {
    /// The transaction as the write path's statements see it: where the ordering keys are
    /// locked, before the key is stored.
    fn statements(&mut self) -> impl Statements + '_;

    /// The key stored and the transaction committed: in one round trip where the driver
    /// pipelines. Returns the statement's result and the commit's; the commit's means something
    /// only when the statement's is `Ok`. `complete` refuses a savepoint (TXK03); a driver that
    /// knows its depth refuses a nested transaction before sending anything.
    fn complete_key_and_commit<'a>(
        self,
        complete: &'a CompleteKey<'a>,
    ) -> BoxFuture<'a, (StoreResult<Option<Inserted>>, StoreResult<()>)>
    where
        Self: 'a;

    /// Commits the transaction.
    fn commit_tx(self) -> impl Future<Output = StoreResult<()>> + Send;

    /// Rolls the transaction back.
    fn rollback_tx(self) -> impl Future<Output = StoreResult<()>> + Send;
}

/// tokio-postgres and deadpool: the statements of `store::keys` and `store::messages` over
/// [`TxExecutor::rows`] (pipelined where the executor pipelines).
impl<T: TxExecutor> Statements for &T {
    fn lock_and_lookup<'a>(
        &'a mut self,
        scope: &'a str,
        key: &'a str,
        lock_timeout: &'a str,
    ) -> impl Future<Output = StoreResult<Option<Locked>>> + Send + 'a {
        let tx: &'a T = self;
        async move { Ok(keys::lock_and_lookup(tx, scope, key, lock_timeout).await?) }
    }

    fn claim_key<'a>(
        &'a mut self,
        claim: &'a ClaimKey<'a>,
    ) -> impl Future<Output = StoreResult<bool>> + Send + 'a {
        let tx: &'a T = self;
        async move { Ok(keys::claim_key(tx, claim).await?) }
    }

    fn complete_key<'a>(
        &'a mut self,
        complete: &'a CompleteKey<'a>,
    ) -> impl Future<Output = StoreResult<Option<Inserted>>> + Send + 'a {
        let tx: &'a T = self;
        async move { Ok(keys::complete_key(tx, complete).await?) }
    }

    fn insert_messages<'a>(
        &'a mut self,
        rows: &'a MessageColumns,
    ) -> impl Future<Output = StoreResult<Inserted>> + Send + 'a {
        let tx: &'a T = self;
        async move { Ok(messages::insert_messages(tx, rows).await?) }
    }

    fn lock_ordering_keys<'a>(
        &'a mut self,
        keys: &'a [&'a str],
    ) -> impl Future<Output = StoreResult<()>> + Send + 'a {
        let tx: &'a T = self;
        async move { Ok(messages::lock_ordering_keys(tx, keys).await?) }
    }

    fn notify(&mut self) -> impl Future<Output = StoreResult<()>> + Send + '_ {
        let tx: &T = self;
        async move { Ok(super::wake::notify(tx).await?) }
    }

    fn inbox_write<'a>(
        &'a mut self,
        record: &'a Record<'a>,
        write: inbox::Write,
    ) -> impl Future<Output = StoreResult<Option<DateTime<Utc>>>> + Send + 'a {
        let tx: &'a T = self;
        async move { Ok(inbox::write(tx, record, write).await?) }
    }

    fn inbox_lookup<'a>(
        &'a mut self,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = StoreResult<Option<FoundRecord>>> + Send + 'a {
        let tx: &'a T = self;
        async move { Ok(inbox::lookup(tx, consumer, message_id).await?) }
    }
}

/// How a tokio-postgres or deadpool transaction ends, for [`Committing`].
pub trait Finish: Sized + Send {
    /// Its `commit()`.
    fn commit(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send;
    /// Its `rollback()`.
    fn rollback(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send;
}

impl Finish for tokio_postgres::Transaction<'_> {
    fn commit(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        tokio_postgres::Transaction::commit(self)
    }
    fn rollback(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        tokio_postgres::Transaction::rollback(self)
    }
}

impl Finish for deadpool_postgres::Transaction<'_> {
    fn commit(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        deadpool_postgres::Transaction::commit(self)
    }
    fn rollback(self) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send {
        deadpool_postgres::Transaction::rollback(self)
    }
}

/// tokio-postgres and deadpool: the statement and the COMMIT pipelined in one round trip.
impl<T: CommitExecutor + Finish> Committing for T {
    fn statements(&mut self) -> impl Statements + '_ {
        &*self
    }

    fn complete_key_and_commit<'a>(
        self,
        complete: &'a CompleteKey<'a>,
    ) -> BoxFuture<'a, (StoreResult<Option<Inserted>>, StoreResult<()>)>
    where
        Self: 'a,
    {
        Box::pin(async move {
            let (written, committed) = keys::complete_key_and_commit(self, complete).await;
            (written.map_err(Into::into), committed.map_err(Into::into))
        })
    }

    async fn commit_tx(self) -> StoreResult<()> {
        Ok(Finish::commit(self).await?)
    }

    async fn rollback_tx(self) -> StoreResult<()> {
        Ok(Finish::rollback(self).await?)
    }
}
