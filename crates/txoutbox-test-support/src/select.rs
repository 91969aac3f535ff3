//! What a test's own `SELECT` returns, without the row plumbing: one value
//! ([`value`](crate::select::value)), the first column of every row
//! ([`column()`](crate::select::column)) or the first two
//! ([`column_pairs`](crate::select::column_pairs)), typed by the caller, on a connection or in a
//! transaction; the `_with` forms bind parameters. For reads the typed helpers
//! ([`counts`](crate::counts), [`log_of`](crate::log_of), [`row_status`](crate::row_status)) do
//! not cover.

use anyhow::{Context, Result};
use tokio_postgres::types::{FromSqlOwned, ToSql};
use tokio_postgres::GenericClient;

/// The first column of the one row `sql` returns; fails when it returns no row or several.
pub async fn value<T: FromSqlOwned>(client: &impl GenericClient, sql: &str) -> Result<T> {
    value_with(client, sql, &[]).await
}

/// [`value`] of `sql` with `params`.
pub async fn value_with<T: FromSqlOwned>(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<T> {
    let row = client
        .query_one(sql, params)
        .await
        .with_context(|| format!("one row of {sql}"))?;
    Ok(row.try_get(0)?)
}

/// The first column of every row `sql` returns, in the order it returns them.
pub async fn column<T: FromSqlOwned>(client: &impl GenericClient, sql: &str) -> Result<Vec<T>> {
    column_with(client, sql, &[]).await
}

/// [`column()`] of `sql` with `params`.
pub async fn column_with<T: FromSqlOwned>(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<T>> {
    let rows = client.query(sql, params).await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// The first two columns of every row `sql` returns, in the order it returns them.
pub async fn column_pairs<A: FromSqlOwned, B: FromSqlOwned>(
    client: &impl GenericClient,
    sql: &str,
) -> Result<Vec<(A, B)>> {
    column_pairs_with(client, sql, &[]).await
}

/// [`column_pairs`] of `sql` with `params`.
pub async fn column_pairs_with<A: FromSqlOwned, B: FromSqlOwned>(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<(A, B)>> {
    let rows = client.query(sql, params).await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}
