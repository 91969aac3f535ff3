//! Which destinations exist: what the typo check of pause and resume reads.

use crate::store::statements::destinations::{KNOWN, NAMED};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use crate::admin::AdminError;

/// Whether anything names `destination` ([`NAMED`]).
pub(crate) async fn named(
    client: &impl GenericClient,
    destination: &str,
) -> Result<bool, AdminError> {
    Ok(client
        .query_typed_one(NAMED, &[(&destination, Type::TEXT)])
        .await?
        .try_get(0)?)
}

/// The destination names rows and flow control hold, at most `per_table` from each large table
/// ([`KNOWN`]).
pub(crate) async fn known(
    client: &impl GenericClient,
    per_table: i64,
) -> Result<Vec<String>, AdminError> {
    client
        .query_typed(KNOWN, &[(&per_table, Type::INT8)])
        .await?
        .iter()
        .map(|row| row.try_get(0).map_err(AdminError::from))
        .collect()
}
