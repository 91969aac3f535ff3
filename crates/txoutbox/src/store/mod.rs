//! The store: every SQL statement of the write path and the relay, one file per table, each
//! behind a typed function that binds its parameters and decodes its rows. Code outside this
//! module calls functions, never statement text.
//!
//! Layout: [`keys`] (`txoutbox_idempotency_keys`), [`messages`] (`txoutbox_messages`: enqueue,
//! claim, reclaim), [`attempts`] (`txoutbox_attempt_log`: the completion of a batch of attempts),
//! [`destinations`] (`txoutbox_destinations`: flow control), [`wake`] (the wake-up channel) and
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
pub(crate) mod destinations;
pub(crate) mod keys;
pub(crate) mod messages;
pub(crate) mod schema;
pub(crate) mod wake;

use std::future::Future;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

/// A statement's parameters with their Postgres types.
pub type Params<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

/// What a store function returns: its typed rows, or the database's error.
pub(crate) type Result<T> = std::result::Result<T, Error>;

/// A Postgres transaction of the caller's that txoutbox may run statements in.
///
/// Implemented for `tokio_postgres::Transaction` (unnamed statements with `query_typed`: parse,
/// bind and execute in one round trip, which also works behind PgBouncer in transaction mode)
/// and `deadpool_postgres::Transaction` (prepared statements from the connection's cache, parsed
/// and planned once per connection: the fast path).
pub trait TxExecutor: Sync {
    /// Runs one statement and collects its rows.
    fn rows<'a>(
        &'a self,
        sql: &'static str,
        params: Params<'a>,
    ) -> impl Future<Output = std::result::Result<Vec<Row>, Error>> + Send + 'a;
}

impl TxExecutor for tokio_postgres::Transaction<'_> {
    fn rows<'a>(
        &'a self,
        sql: &'static str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Vec<Row>>> + Send + 'a {
        self.query_typed(sql, params)
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
    let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
    let statement = conn.prepare_typed_cached(sql, &types).await?;
    let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
    conn.query(&statement, &values).await
}
