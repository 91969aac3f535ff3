//! What pause, resume and the flow-control view read and write.

use crate::store::statements::attempt_log::LOG_DESTINATION_ACTION;
use crate::store::statements::destinations::{FLOW_STATE, FLOW_STATES, PAUSE, RESUME};
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row, Transaction};

use super::{rows, run, Param};
use crate::admin::{AdminError, DestinationFlow};
use crate::state::AttemptOutcome;

fn flow(row: &Row) -> Result<DestinationFlow, AdminError> {
    Ok(DestinationFlow {
        destination: row.try_get("destination")?,
        state: row.try_get("state")?,
        throttled: row.try_get("throttled")?,
        paused_at: row.try_get("paused_at")?,
        paused_by: row.try_get("paused_by")?,
        paused_reason: row.try_get("paused_reason")?,
        rate_per_sec: row.try_get("rate_per_sec")?,
        tokens: row.try_get("tokens")?,
        failures: row.try_get("failures")?,
        open_until: row.try_get("open_until")?,
        open_reason: row.try_get("open_reason")?,
    })
}

/// Every destination with a flow-control row ([`FLOW_STATES`]).
pub(crate) async fn states(
    client: &impl GenericClient,
) -> Result<Vec<DestinationFlow>, AdminError> {
    rows(client, FLOW_STATES, &[], flow).await
}

/// The flow-control state of `destination` ([`FLOW_STATE`]).
pub(crate) async fn state(
    client: &impl GenericClient,
    destination: &str,
) -> Result<DestinationFlow, AdminError> {
    let row = client
        .query_typed_one(FLOW_STATE, &[(&destination, Type::TEXT)])
        .await?;
    flow(&row)
}

/// Pauses `destination` by `by` for `reason` ([`PAUSE`]).
pub(crate) async fn pause(
    tx: &Transaction<'_>,
    destination: &str,
    by: &str,
    reason: &str,
) -> Result<(), AdminError> {
    let params: [Param<'_>; 3] = [
        (&destination, Type::TEXT),
        (&by, Type::TEXT),
        (&reason, Type::TEXT),
    ];
    run(tx, PAUSE, &params).await
}

/// Ends the pause of `destination`; false when it was not paused ([`RESUME`]).
pub(crate) async fn resume(tx: &Transaction<'_>, destination: &str) -> Result<bool, AdminError> {
    Ok(!tx
        .query_typed(RESUME, &[(&destination, Type::TEXT)])
        .await?
        .is_empty())
}

/// Logs a destination-wide operator action ([`LOG_DESTINATION_ACTION`]).
pub(crate) async fn log_action(
    client: &impl GenericClient,
    destination: &str,
    outcome: AttemptOutcome,
    note: &str,
) -> Result<(), AdminError> {
    let params: [Param<'_>; 3] = [
        (&destination, Type::TEXT),
        (&outcome.as_str(), Type::TEXT),
        (&note, Type::TEXT),
    ];
    run(client, LOG_DESTINATION_ACTION, &params).await
}
