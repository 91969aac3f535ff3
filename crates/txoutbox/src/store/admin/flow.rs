//! What pause, resume and the flow-control view read and write.

use crate::store::statements::attempt_log::LOG_DESTINATION_ACTION;
use crate::store::statements::destinations::{FLOW_STATE, FLOW_STATES, PAUSE, RESUME};
use tokio_postgres::{GenericClient, Row, Transaction};

use super::{count, one, rows, run};
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
    let row = one(client, FLOW_STATE, &[&destination]).await?;
    flow(&row)
}

/// Pauses `destination` by `by` for `reason` ([`PAUSE`]).
pub(crate) async fn pause(
    tx: &Transaction<'_>,
    destination: &str,
    by: &str,
    reason: &str,
) -> Result<(), AdminError> {
    run(tx, PAUSE, &[&destination, &by, &reason]).await
}

/// Ends the pause of `destination`; false when it was not paused ([`RESUME`]).
pub(crate) async fn resume(tx: &Transaction<'_>, destination: &str) -> Result<bool, AdminError> {
    Ok(count(tx, RESUME, &[&destination]).await? > 0)
}

/// Logs a destination-wide operator action ([`LOG_DESTINATION_ACTION`]).
pub(crate) async fn log_action(
    client: &impl GenericClient,
    destination: &str,
    outcome: AttemptOutcome,
    note: &str,
) -> Result<(), AdminError> {
    run(
        client,
        LOG_DESTINATION_ACTION,
        &[&destination, &outcome.as_str(), &note],
    )
    .await
}
