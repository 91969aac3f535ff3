//! What pause, resume and the flow-control view read and write.

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row, Transaction};

use crate::admin::{AdminError, DestinationFlow};
use crate::state::AttemptOutcome;

/// The flow-control state of every destination with a row ([`FLOW_STATE`]'s columns).
const FLOW_STATES: &str = concat!(flow_state!(), " ORDER BY destination");

/// The flow-control state of destination $1: `state` as the claim reads it (paused, open,
/// half_open, closed) and the tokens its bucket holds now.
const FLOW_STATE: &str = concat!(flow_state!(), " WHERE destination = $1");

/// An operator's pause of destination $1 by $2 for reason $3 (its row made if missing).
const PAUSE: &str = "INSERT INTO txoutbox_destinations AS d (destination, paused_at, \
         paused_by, paused_reason) VALUES ($1, now(), $2, $3) \
     ON CONFLICT (destination) DO UPDATE SET paused_at = COALESCE(d.paused_at, now()), \
         paused_by = $2, paused_reason = $3, updated_at = now()";

/// Ends the pause of destination $1; no row when it was not paused.
const RESUME: &str = "UPDATE txoutbox_destinations SET paused_at = NULL, paused_by = NULL, \
         paused_reason = NULL, updated_at = now() \
     WHERE destination = $1 AND paused_at IS NOT NULL RETURNING destination";

/// Logs a destination-wide operator action ($2: `paused`, `resumed`) on destination $1 with the
/// note $3: no message, attempt 0, relay `operator`.
const LOG_DESTINATION_ACTION: &str = "INSERT INTO txoutbox_attempt_log (message_id, destination, \
         attempt, downstream_key, relay, outcome, error, started_at, finished_at) \
     VALUES (NULL, $1, 0, '', 'operator', $2, $3, now(), now())";

fn flow(row: &Row) -> Result<DestinationFlow, AdminError> {
    Ok(DestinationFlow {
        destination: row.try_get("destination")?,
        state: row.try_get("state")?,
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
    client
        .query_typed(FLOW_STATES, &[])
        .await?
        .iter()
        .map(flow)
        .collect()
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
    tx.execute_typed(
        PAUSE,
        &[
            (&destination, Type::TEXT),
            (&by, Type::TEXT),
            (&reason, Type::TEXT),
        ],
    )
    .await?;
    Ok(())
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
    client
        .execute_typed(
            LOG_DESTINATION_ACTION,
            &[
                (&destination, Type::TEXT),
                (&outcome.as_str(), Type::TEXT),
                (&note, Type::TEXT),
            ],
        )
        .await?;
    Ok(())
}
