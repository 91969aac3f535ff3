//! Which destinations exist: what the typo check of pause and resume reads.

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use crate::admin::AdminError;

/// Whether destination $1 is named by a row of the hot table, the delivered history, the
/// discarded rows or flow control. Each probe is one index entry (`txoutbox_messages_dedup`,
/// `txoutbox_delivered_key`, the primary key of `txoutbox_destinations`); discarded rows are
/// few (they leave only by an operator's hand).
const NAMED: &str = "SELECT EXISTS (SELECT 1 FROM txoutbox_messages WHERE destination = $1) \
     OR EXISTS (SELECT 1 FROM txoutbox_delivered WHERE destination = $1) \
     OR EXISTS (SELECT 1 FROM txoutbox_discarded WHERE destination = $1) \
     OR EXISTS (SELECT 1 FROM txoutbox_destinations WHERE destination = $1)";

/// The destinations rows and flow control name, at most $1 from each of the two large tables:
/// a skip scan of each's (destination, downstream_key) index, one probe per name, however many
/// rows each name has.
const KNOWN: &str = "WITH RECURSIVE \
     hot (destination, n) AS ( \
         (SELECT destination, 1 FROM txoutbox_messages ORDER BY destination LIMIT 1) \
         UNION ALL \
         SELECT (SELECT m.destination FROM txoutbox_messages m \
                 WHERE m.destination > hot.destination ORDER BY m.destination LIMIT 1), n + 1 \
         FROM hot WHERE hot.destination IS NOT NULL AND n < $1), \
     delivered (destination, n) AS ( \
         (SELECT destination, 1 FROM txoutbox_delivered ORDER BY destination LIMIT 1) \
         UNION ALL \
         SELECT (SELECT d.destination FROM txoutbox_delivered d \
                 WHERE d.destination > delivered.destination ORDER BY d.destination LIMIT 1), \
             n + 1 \
         FROM delivered WHERE delivered.destination IS NOT NULL AND n < $1) \
     SELECT destination FROM hot WHERE destination IS NOT NULL \
     UNION SELECT destination FROM delivered WHERE destination IS NOT NULL \
     UNION SELECT destination FROM txoutbox_discarded \
     UNION SELECT destination FROM txoutbox_destinations";

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
