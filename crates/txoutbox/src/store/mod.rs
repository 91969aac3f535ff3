//! The store: every SQL statement of the write path and the relay, one file per table, each
//! behind a typed function that binds its parameters and decodes its rows. Code outside this
//! module calls functions, never statement text.
//!
//! Layout: [`keys`] (`txoutbox_idempotency_keys`), [`messages`] (`txoutbox_messages`: enqueue,
//! claim, reclaim), [`attempts`] (`txoutbox_attempt_log`: the completion of a batch of attempts),
//! [`destinations`] (`txoutbox_destinations`: flow control), [`relays`]
//! (`txoutbox_relays`: each relay's heartbeat), [`wake`] (the wake-up channel) and
//! [`schema`] (the migration lock); [`admin`] holds the operator commands' statements, one file
//! a command, since each reads several tables. A statement that writes several tables lives with the table it
//! is mainly about and says so.
//!
//! This file is the executor: [`TxExecutor`] runs a statement on a connection. The caller's
//! transaction implements it (deadpool's: cached prepared statements; tokio-postgres's:
//! one-round-trip unnamed statements); the library's own connections (the relay's pool, the
//! pruner's client) are wrapped in [`Pooled`] or [`Unnamed`], which say how statements are sent.

pub(crate) mod admin;
pub(crate) mod attempts;
pub(crate) mod columns;
pub(crate) mod destinations;
pub(crate) mod driver;
pub(crate) mod inbox;
pub(crate) mod keys;
pub(crate) mod messages;
pub(crate) mod relays;
pub(crate) mod schema;
#[cfg(feature = "sqlx")]
pub(crate) mod sqlx_driver;
pub(crate) mod statements;
pub(crate) mod wake;

use std::future::Future;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

/// A statement's parameters with their Postgres types.
pub type Params<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

/// One parameter with its Postgres type.
pub(crate) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// What a store function returns: its typed rows, or the database's error.
pub(crate) type Result<T> = std::result::Result<T, Error>;

/// A Postgres transaction of the caller's that txoutbox may run statements in.
///
/// Implemented for `tokio_postgres::Transaction` (unnamed statements with `query_typed`: parse,
/// bind and execute in one round trip, which also works behind PgBouncer in transaction mode)
/// and `deadpool_postgres::Transaction` (prepared statements from the connection's cache, parsed
/// and planned once per connection: the fast path).
///
/// Sealed: txoutbox implements it for the drivers whose statements its conformance suite runs;
/// it cannot be implemented outside this crate. Name it as a bound.
pub trait TxExecutor: sealed::Sealed + Sync {
    /// Runs one statement and collects its rows.
    fn rows<'a>(
        &'a self,
        sql: &'static str,
        params: Params<'a>,
    ) -> impl Future<Output = std::result::Result<Vec<Row>, Error>> + Send + 'a;

    /// Runs two statements, `first` executed before `second` starts (so `second` sees what
    /// `first` waited for), in one round trip where the executor can pipeline them. The default
    /// runs them one after the other.
    fn rows_in_order<'a>(
        &'a self,
        first: (&'static str, Params<'a>),
        second: (&'static str, Params<'a>),
    ) -> impl Future<Output = (Result<Vec<Row>>, Result<Vec<Row>>)> + Send + 'a {
        async move {
            let a = self.rows(first.0, first.1).await;
            let b = self.rows(second.0, second.1).await;
            (a, b)
        }
    }
}

/// Runs the registry's statements ([`statements::Statement`]): each value bound with the type
/// its statement's header declares.
pub(crate) trait Run: TxExecutor {
    /// Runs `statement` with `values` ($1 first) and collects its rows.
    fn run<'a>(
        &'a self,
        statement: statements::Statement,
        values: &[&'a (dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        let params = statement.bind(values);
        async move { self.rows(statement.sql, &params).await }
    }
}

impl<T: TxExecutor + ?Sized> Run for T {}

/// Keeps [`TxExecutor`] to the executors of this crate.
mod sealed {
    pub trait Sealed {}

    impl Sealed for tokio_postgres::Transaction<'_> {}
    impl Sealed for deadpool_postgres::Transaction<'_> {}
    impl<C: tokio_postgres::GenericClient + Sync> Sealed for super::Unnamed<'_, C> {}
    impl<C> Sealed for super::Pooled<'_, C> {}
}

impl TxExecutor for tokio_postgres::Transaction<'_> {
    fn rows<'a>(
        &'a self,
        sql: &'static str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        self.query_typed(sql, params)
    }

    fn rows_in_order<'a>(
        &'a self,
        first: (&'static str, Params<'a>),
        second: (&'static str, Params<'a>),
    ) -> impl Future<Output = (Result<Vec<Row>>, Result<Vec<Row>>)> + Send + 'a {
        in_order(
            self.query_typed(first.0, first.1),
            self.query_typed(second.0, second.1),
        )
    }
}

impl TxExecutor for deadpool_postgres::Transaction<'_> {
    fn rows<'a>(
        &'a self,
        sql: &'static str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        prepared(self, sql, params)
    }

    /// Both statements are prepared before either runs (a statement still being prepared would
    /// let the other one's execution reach the server first); if one cannot be, neither runs,
    /// and its error is the first result.
    async fn rows_in_order<'a>(
        &'a self,
        first: (&'static str, Params<'a>),
        second: (&'static str, Params<'a>),
    ) -> (Result<Vec<Row>>, Result<Vec<Row>>) {
        let (first_types, second_types) = (types(first.1), types(second.1));
        let (a, b) = futures::join!(
            self.prepare_typed_cached(first.0, &first_types),
            self.prepare_typed_cached(second.0, &second_types)
        );
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return (Err(e), Ok(Vec::new())),
        };
        let (first_values, second_values) = (values(first.1), values(second.1));
        in_order(
            self.query(&a, &first_values),
            self.query(&b, &second_values),
        )
        .await
    }
}

/// The types of `params`, for a prepared statement.
fn types(params: Params<'_>) -> Vec<Type> {
    params.iter().map(|(_, t)| t.clone()).collect()
}

/// The values of `params`, for a prepared statement's execution.
fn values<'a>(params: Params<'a>) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|(v, _)| *v).collect()
}

/// Waits for two statements sent in this order: `first` is polled once (tokio-postgres sends a
/// request when its future is first polled) before `second` is, then both are awaited together.
pub(crate) async fn in_order<A, B>(first: A, second: B) -> (A::Output, B::Output)
where
    A: Future,
    B: Future,
{
    let mut first = std::pin::pin!(first);
    match futures::poll!(first.as_mut()) {
        std::task::Poll::Ready(a) => (a, second.await),
        std::task::Poll::Pending => futures::join!(first, second),
    }
}

/// A caller's transaction that txoutbox may also commit: tokio-postgres's and deadpool's (the
/// bound of `Claim::commit`, which stores a request's key and commits in one round trip).
///
/// Sealed, as [`TxExecutor`] is.
pub trait CommitExecutor: TxExecutor + Sized + Send {
    /// Runs `sql`, then COMMIT, in one round trip, and consumes the transaction. The statement is
    /// sent first; if it fails, the COMMIT finds the transaction aborted and rolls it back, so
    /// the commit's result means something only when the statement's is `Ok`.
    ///
    /// `sql` must fail unless it runs in the outermost transaction, with no savepoint open: a
    /// COMMIT ends the outermost transaction, whatever the depth of `self`. When it fails, the
    /// COMMIT has rolled back the whole transaction on the server, and the connection is left
    /// out of any transaction when `self` was the outermost, else inside an aborted one, so that
    /// the statements of the enclosing transactions fail until they are rolled back.
    ///
    /// Boxed: an unboxed future here is one the compiler cannot prove `Send` for every lifetime
    /// of the transaction, so a handler awaiting it could not be spawned.
    fn rows_then_commit<'a>(
        self,
        sql: &'static str,
        params: Params<'a>,
    ) -> futures::future::BoxFuture<'a, (Result<Vec<Row>>, Result<()>)>
    where
        Self: 'a;
}

impl CommitExecutor for tokio_postgres::Transaction<'_> {
    fn rows_then_commit<'a>(
        self,
        sql: &'static str,
        params: Params<'a>,
    ) -> futures::future::BoxFuture<'a, (Result<Vec<Row>>, Result<()>)>
    where
        Self: 'a,
    {
        Box::pin(async move {
            let (rows, committed) = {
                let client = self.client();
                then_commit(client, client.query_typed(sql, params)).await
            };
            settle(self, rows, committed).await
        })
    }
}

impl CommitExecutor for deadpool_postgres::Transaction<'_> {
    fn rows_then_commit<'a>(
        self,
        sql: &'static str,
        params: Params<'a>,
    ) -> futures::future::BoxFuture<'a, (Result<Vec<Row>>, Result<()>)>
    where
        Self: 'a,
    {
        Box::pin(async move {
            // Prepared before the pipeline: the statement must be the first request sent.
            let statement = match self.prepare_typed_cached(sql, &types(params)).await {
                Ok(statement) => statement,
                // Nothing sent to commit: dropping the transaction rolls it back.
                Err(e) => return (Err(e), Ok(())),
            };
            let values = values(params);
            let (rows, committed) =
                then_commit(self.client(), self.query(&statement, &values)).await;
            settle(self, rows, committed).await
        })
    }
}

/// Sends `statement`, then COMMIT on `client`, and waits for both; the COMMIT's result is `None`
/// when it was not sent (the statement failed before reaching the server: the transaction is
/// still open, and its drop rolls it back). tokio-postgres sends a request when its future is
/// first polled: the statement's future is polled once before the COMMIT's exists, so the server
/// receives them in that order.
async fn then_commit(
    client: &tokio_postgres::Client,
    statement: impl Future<Output = Result<Vec<Row>>>,
) -> (Result<Vec<Row>>, Option<Result<()>>) {
    let mut statement = std::pin::pin!(statement);
    match futures::poll!(statement.as_mut()) {
        std::task::Poll::Ready(Err(e)) => (Err(e), None),
        std::task::Poll::Ready(Ok(rows)) => (Ok(rows), Some(client.batch_execute("COMMIT").await)),
        std::task::Poll::Pending => {
            let (rows, committed) = futures::join!(statement, client.batch_execute("COMMIT"));
            (rows, Some(committed))
        }
    }
}

/// A transaction (tokio-postgres's or deadpool's) that a COMMIT sent behind its back has ended
/// on the server.
trait Ended: Sized + Send {
    /// Disposes of it without sending anything (its drop would send a ROLLBACK).
    fn forget(self);

    /// Opens a transaction block, then rolls `self` back in it, as `rollback` does: ROLLBACK
    /// when it is the outermost transaction, which closes the block again and leaves the
    /// connection clean; ROLLBACK TO its savepoint when it is one, which the new block does not
    /// know: that fails, and leaves the connection inside an aborted transaction block. Every
    /// later statement of the enclosing transactions then fails (SQLSTATE 25P02) instead of
    /// running outside any transaction, until the outermost one is rolled back (its
    /// `rollback()` or its drop) and leaves the connection clean. The depth of a
    /// tokio-postgres transaction is private to it: its own rollback is the one statement that
    /// depends on it.
    fn close(self) -> impl Future<Output = ()> + Send;
}

impl Ended for tokio_postgres::Transaction<'_> {
    fn forget(self) {
        std::mem::forget(self);
    }

    async fn close(self) {
        // Errors ignored: on a lost connection there is nothing left to close, and the
        // savepoint's rollback is meant to fail.
        let _ = self.client().batch_execute("BEGIN").await;
        let _ = self.rollback().await;
    }
}

impl Ended for deadpool_postgres::Transaction<'_> {
    fn forget(self) {
        forget_ended(self);
    }

    async fn close(self) {
        let _ = self.client().batch_execute("BEGIN").await;
        let _ = self.rollback().await;
    }
}

/// What [`then_commit`] leaves of `tx`. When the COMMIT was not sent, dropping `tx` rolls it
/// back. When it was sent, the server has ended the outermost transaction: after a statement
/// that succeeded, which only the outermost transaction can run (see
/// [`CommitExecutor::rows_then_commit`]), `tx` was it and is forgotten; after one that failed,
/// `tx` may be a savepoint whose enclosing transactions the caller still holds, and it is closed
/// as [`Ended::close`] says.
async fn settle<T: Ended>(
    tx: T,
    rows: Result<Vec<Row>>,
    committed: Option<Result<()>>,
) -> (Result<Vec<Row>>, Result<()>) {
    match committed {
        None => {
            drop(tx);
            (rows, Ok(()))
        }
        Some(committed) if rows.is_ok() => {
            tx.forget();
            (rows, committed)
        }
        Some(committed) => {
            tx.close().await;
            (rows, committed)
        }
    }
}

/// Disposes of a deadpool transaction the server has ended, without the ROLLBACK its drop would
/// send. Forgetting it would also leak its hold on the connection's statement cache (kept alive
/// after the connection closes): that hold is swapped for one on a cache parked for the process's
/// life, and the real one released.
fn forget_ended(mut tx: deadpool_postgres::Transaction<'_>) {
    static PARKED: std::sync::OnceLock<std::sync::Arc<deadpool_postgres::StatementCache>> =
        std::sync::OnceLock::new();
    let parked = PARKED.get_or_init(|| tx.statement_cache.clone()).clone();
    drop(std::mem::replace(&mut tx.statement_cache, parked));
    std::mem::forget(tx);
}

/// A connection of the library's own that sends unnamed statements (`query_typed`): a bare
/// `tokio_postgres::Client` or transaction.
pub(crate) struct Unnamed<'a, C>(pub &'a C);

impl<C: tokio_postgres::GenericClient + Sync> TxExecutor for Unnamed<'_, C> {
    fn rows<'a>(
        &'a self,
        sql: &'static str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        self.0.query_typed(sql, params)
    }
}

/// A pooled connection (or a transaction on one) of the relay's, sending prepared statements
/// from the connection's cache or unnamed ones, as `prepared` says
/// (`RelayConfig::prepared_statements`: off behind PgBouncer in transaction mode).
pub(crate) struct Pooled<'a, C> {
    conn: &'a C,
    prepared: bool,
}

impl<'a, C> Pooled<'a, C> {
    /// `conn`, sending prepared statements when `prepared` is set.
    pub(crate) fn new(conn: &'a C, prepared: bool) -> Self {
        Self { conn, prepared }
    }

    /// `conn`, sending unnamed statements (for statements run once in a while).
    pub(crate) fn unnamed(conn: &'a C) -> Self {
        Self::new(conn, false)
    }
}

impl TxExecutor for Pooled<'_, deadpool_postgres::Object> {
    async fn rows<'a>(&'a self, sql: &'static str, params: Params<'a>) -> Result<Vec<Row>> {
        if self.prepared {
            prepared(self.conn, sql, params).await
        } else {
            self.conn.query_typed(sql, params).await
        }
    }
}

impl TxExecutor for Pooled<'_, deadpool_postgres::Transaction<'_>> {
    async fn rows<'a>(&'a self, sql: &'static str, params: Params<'a>) -> Result<Vec<Row>> {
        if self.prepared {
            prepared(self.conn, sql, params).await
        } else {
            self.conn.query_typed(sql, params).await
        }
    }
}

/// Runs `sql` as a prepared statement from the connection's cache.
async fn prepared<C: deadpool_postgres::GenericClient>(
    conn: &C,
    sql: &'static str,
    params: Params<'_>,
) -> Result<Vec<Row>> {
    let statement = conn.prepare_typed_cached(sql, &types(params)).await?;
    conn.query(&statement, &values(params)).await
}
