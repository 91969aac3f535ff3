//! The transaction the write path runs its statements in: always the caller's.
//!
//! Two kinds are accepted. A `deadpool_postgres::Transaction` runs each statement as a prepared
//! statement from the connection's cache (parsed and planned once per connection: the fast
//! path). A bare `tokio_postgres::Transaction` runs unnamed statements with `query_typed`
//! (parse, bind and execute in one round trip), which also works behind PgBouncer in transaction
//! mode, where prepared statements do not.

use std::future::Future;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

/// A statement's parameters with their Postgres types.
pub type Params<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

/// A Postgres transaction of the caller's that txoutbox may run statements in.
pub trait TxExecutor: Sync {
    /// Runs one statement and collects its rows.
    fn rows<'a>(
        &'a self,
        sql: &'static str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 'a;
}

impl TxExecutor for tokio_postgres::Transaction<'_> {
    fn rows<'a>(
        &'a self,
        sql: &'static str,
        params: Params<'a>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 'a {
        self.query_typed(sql, params)
    }
}

impl TxExecutor for deadpool_postgres::Transaction<'_> {
    async fn rows<'a>(&'a self, sql: &'static str, params: Params<'a>) -> Result<Vec<Row>, Error> {
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        let statement = self.prepare_typed_cached(sql, &types).await?;
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        self.query(&statement, &values).await
    }
}
