//! The refusals replay and discard share: a bound on the rows one call may change, and the error
//! for an id no table holds (or one an operator discarded).

use tokio_postgres::GenericClient;
use uuid::Uuid;

use super::AdminError;
use crate::state::MessageStatus;
use crate::store::admin as store;

/// Why a discarded row is neither replayed nor discarded again.
pub(super) const DISCARDED_REASON: &str =
    "an operator discarded it (see its history for the reason); \
     enqueue the effect again to send it";

/// The error for an id that is in no table a replay or discard reads: [`AdminError::NotFound`],
/// or [`AdminError::NotReplayable`] when the row was discarded.
pub(super) async fn not_found(
    client: &impl GenericClient,
    id: Uuid,
) -> Result<AdminError, AdminError> {
    let discarded = store::replay::is_discarded(client, id).await?;
    Ok(if discarded {
        AdminError::NotReplayable {
            id,
            status: MessageStatus::Discarded,
            reason: DISCARDED_REASON.to_owned(),
        }
    } else {
        AdminError::NotFound(id)
    })
}

/// [`AdminError::TooMany`] when `count` rows exceed the operator's bound `max_rows`.
pub(super) fn check_max(count: u64, max_rows: Option<u64>) -> Result<(), AdminError> {
    match max_rows {
        Some(max) if count > max => Err(AdminError::TooMany { count, max }),
        _ => Ok(()),
    }
}
