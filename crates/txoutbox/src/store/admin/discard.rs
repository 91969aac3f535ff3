//! What a discard selects and writes (its rows are locked by [`super::replay::hot_rows`]).

use crate::store::statements::discarded::DISCARD;
use crate::store::statements::messages::DISCARD_SELECT;
use tokio_postgres::{GenericClient, Transaction};
use uuid::Uuid;

use super::{ids_by_status, run};
use crate::admin::{AdminError, FilterParams};
use crate::state::MessageStatus;

/// The ids a discard by filter selects among `statuses` ([`DISCARD_SELECT`]).
pub(crate) async fn select(
    client: &impl GenericClient,
    statuses: &[MessageStatus],
    filter: &FilterParams,
) -> Result<Vec<Uuid>, AdminError> {
    ids_by_status(client, DISCARD_SELECT, statuses, filter).await
}

/// Discards hot rows `ids` with `reason`, logging `note` ([`DISCARD`]).
pub(crate) async fn discard(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    reason: &str,
    note: &str,
) -> Result<(), AdminError> {
    run(tx, DISCARD, &[&ids, &reason, &note]).await
}
