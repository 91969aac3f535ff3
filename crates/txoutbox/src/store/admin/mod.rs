//! The functions of the operator's tools, one file per command: each binds its statements'
//! parameters and decodes their rows. Hot rows (`pending`, `in_flight`, `failed`,
//! `unknown`) are in `txoutbox_messages`; `delivered` rows in `txoutbox_delivered`, where the
//! relay's completion statement moved them.
//!
//! The statements are files under `store/sql/` (see [`crate::store::statements`]). A filter binds
//! the same parameters everywhere ($2..$8: destination, since (timestamp, seconds ago), until
//! (timestamp, seconds ago), downstream key, ordering key; $10, $11: error text contained,
//! normalised error text; $12, $13: the keyset cursor, (created_at, seq) before which a page
//! starts), in [`bind`], and its conditions read the same in every statement that takes one.
//! Times are compared with `created_at` (enqueue time); relative bounds use the database's
//! clock, the one that wrote `created_at`.

use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{GenericClient, Row};

use crate::admin::{AdminError, FilterParams};
use crate::state::MessageStatus;
use crate::store::statements::Statement;

pub(crate) mod discard;
pub(crate) mod flow;
pub(crate) mod inspect;
pub(crate) mod known;
pub(crate) mod purge;
pub(crate) mod replay;
pub(crate) mod stats;

/// The relays' wake-up channel (a replay is rare: the hint in the transaction costs nothing).
/// Hints the relays on their wake-up channel ([`crate::store::wake::notify`]).
pub(crate) async fn notify(client: &(impl GenericClient + Sync)) -> Result<(), AdminError> {
    crate::store::wake::notify(&crate::store::Unnamed(client)).await?;
    Ok(())
}

/// A parameter's value (its type is the statement's: [`Statement`]).
type Value<'a> = &'a (dyn ToSql + Sync);

/// A filtered statement's values: `first` as $1, then the filter's ($2..$13).
fn bind<'a>(first: Value<'a>, p: &'a FilterParams) -> [Value<'a>; 13] {
    [
        first,
        &p.destination,
        &p.since_at,
        &p.since_ago,
        &p.until_at,
        &p.until_ago,
        &p.downstream_key,
        &p.ordering_key,
        &p.limit,
        &p.error_contains,
        &p.error_class,
        &p.before_at,
        &p.before_seq,
    ]
}

/// Runs `statement`; the rows it returns, if any, are not read.
async fn run(
    client: &impl GenericClient,
    statement: Statement,
    values: &[Value<'_>],
) -> Result<(), AdminError> {
    client
        .query_typed(statement.sql, &statement.bind(values))
        .await?;
    Ok(())
}

/// The rows `statement` returns, each decoded by `decode`.
async fn rows<T>(
    client: &impl GenericClient,
    statement: Statement,
    values: &[Value<'_>],
    decode: impl FnMut(&Row) -> Result<T, AdminError>,
) -> Result<Vec<T>, AdminError> {
    client
        .query_typed(statement.sql, &statement.bind(values))
        .await?
        .iter()
        .map(decode)
        .collect()
}

/// How many rows `statement` returns (a statement that answers a row per row it changed).
async fn count(
    client: &impl GenericClient,
    statement: Statement,
    values: &[Value<'_>],
) -> Result<u64, AdminError> {
    let rows = client
        .query_typed(statement.sql, &statement.bind(values))
        .await?;
    Ok(rows.len() as u64)
}

/// The first column of each row `statement` returns.
async fn column<T: for<'a> FromSql<'a>>(
    client: &impl GenericClient,
    statement: Statement,
    values: &[Value<'_>],
) -> Result<Vec<T>, AdminError> {
    rows(client, statement, values, |row| Ok(row.try_get(0)?)).await
}

/// The one row `statement` returns.
async fn one(
    client: &impl GenericClient,
    statement: Statement,
    values: &[Value<'_>],
) -> Result<Row, tokio_postgres::Error> {
    client
        .query_typed_one(statement.sql, &statement.bind(values))
        .await
}

/// The row `statement` returns, if any.
async fn opt(
    client: &impl GenericClient,
    statement: Statement,
    values: &[Value<'_>],
) -> Result<Option<Row>, tokio_postgres::Error> {
    client
        .query_typed_opt(statement.sql, &statement.bind(values))
        .await
}

/// The first column of the one row `statement` returns.
async fn value<T: for<'a> FromSql<'a>>(
    client: &impl GenericClient,
    statement: Statement,
    values: &[Value<'_>],
) -> Result<T, AdminError> {
    Ok(one(client, statement, values).await?.try_get(0)?)
}

/// The ids a filtered `statement` selects among `statuses` (its `$1`, the filter after it).
async fn ids_by_status(
    client: &impl GenericClient,
    statement: Statement,
    statuses: &[MessageStatus],
    filter: &FilterParams,
) -> Result<Vec<uuid::Uuid>, AdminError> {
    let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
    column(client, statement, &bind(&names, filter)).await
}
