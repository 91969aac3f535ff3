//! Which destinations exist: what the typo check of pause and resume reads.

use crate::store::statements::destinations::{KNOWN, NAMED};
use tokio_postgres::GenericClient;

use super::{column, value};
use crate::admin::AdminError;

/// Whether anything names `destination` ([`NAMED`]).
pub(crate) async fn named(
    client: &impl GenericClient,
    destination: &str,
) -> Result<bool, AdminError> {
    value(client, NAMED, &[&destination]).await
}

/// The destination names rows and flow control hold, at most `per_table` from each large table
/// ([`KNOWN`]).
pub(crate) async fn known(
    client: &impl GenericClient,
    per_table: i64,
) -> Result<Vec<String>, AdminError> {
    column(client, KNOWN, &[&per_table]).await
}
