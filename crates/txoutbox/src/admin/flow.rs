//! The operator's side of flow control: what state each destination is in (`stats`), and
//! pausing and resuming one (`txoutbox pause`, `txoutbox resume`). A pause is a row of
//! `txoutbox_destinations` that every relay's claim reads, so every relay obeys it at its next
//! claim (within one poll interval); each pause and resume is logged in the attempt log without
//! a message, under its destination (relay `operator`, outcome `paused` or `resumed`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, GenericClient};

use super::AdminError;
use crate::state::AttemptOutcome;
use crate::store::admin as store;

/// A destination's flow-control state, as `txoutbox stats` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DestinationFlow {
    /// The destination.
    pub destination: String,
    /// `paused` (by an operator), `open` (its breaker, or the downstream's throttle: no calls
    /// until `open_until`), `half_open` (one probe may go), or `closed`.
    pub state: String,
    /// True when it is `open` because the downstream asked every relay to wait (most of a relay's
    /// recent answers were throttled), not because of its breaker.
    pub throttled: bool,
    /// When an operator paused it, who and why.
    pub paused_at: Option<DateTime<Utc>>,
    /// Who paused it.
    pub paused_by: Option<String>,
    /// Why.
    pub paused_reason: Option<String>,
    /// Its rate limit, calls per second (shared by every relay).
    pub rate_per_sec: Option<f64>,
    /// Tokens in its bucket now (rate-limited destinations only).
    pub tokens: Option<f64>,
    /// Consecutive retryable failures counted by its breaker.
    pub failures: i32,
    /// Until when it is open (the breaker, or the downstream's throttle).
    pub open_until: Option<DateTime<Utc>>,
    /// Why it is open (a failure count, or a downstream throttling most calls).
    pub open_reason: Option<String>,
}

impl DestinationFlow {
    /// True when flow control holds anything back or counts anything for this destination.
    pub fn is_notable(&self) -> bool {
        self.state != "closed" || self.rate_per_sec.is_some() || self.failures > 0
    }
}

/// Every destination with a flow-control row, by name.
pub async fn destination_flows(
    client: &impl GenericClient,
) -> Result<Vec<DestinationFlow>, AdminError> {
    store::flow::states(client).await
}

/// Pauses `destination` for every relay until [`resume_destination`]: its rows stay pending,
/// unleased, spending no attempt. `reason` is required (it is shown by `stats` and kept in the
/// attempt log); `operator` names who paused it. Pausing a paused destination updates the
/// reason. Calls already out finish; no new one starts after each relay's next claim.
pub async fn pause_destination(
    client: &mut Client,
    destination: &str,
    reason: &str,
    operator: Option<&str>,
) -> Result<DestinationFlow, AdminError> {
    check_text("destination", destination)?;
    check_text("reason", reason)?;
    let by = operator.unwrap_or("operator");
    check_text("operator", by)?;
    let tx = client.transaction().await?;
    store::flow::pause(&tx, destination, by, reason.trim()).await?;
    store::flow::log_action(
        &tx,
        destination,
        AttemptOutcome::Paused,
        &format!("{} (by {by})", reason.trim()),
    )
    .await?;
    let flow = store::flow::state(&tx, destination).await?;
    tx.commit().await?;
    Ok(flow)
}

/// Ends an operator's pause of `destination`: relays claim its rows again at once (they are
/// woken). A destination that was not paused is left as it is ([`AdminError::Invalid`]).
pub async fn resume_destination(
    client: &mut Client,
    destination: &str,
    operator: Option<&str>,
) -> Result<DestinationFlow, AdminError> {
    check_text("destination", destination)?;
    let by = operator.unwrap_or("operator");
    check_text("operator", by)?;
    let tx = client.transaction().await?;
    if !store::flow::resume(&tx, destination).await? {
        return Err(AdminError::Invalid(format!(
            "destination {destination:?} is not paused"
        )));
    }
    store::flow::log_action(
        &tx,
        destination,
        AttemptOutcome::Resumed,
        &format!("by {by}"),
    )
    .await?;
    store::notify(&tx).await?;
    let flow = store::flow::state(&tx, destination).await?;
    tx.commit().await?;
    Ok(flow)
}

fn check_text(what: &str, text: &str) -> Result<(), AdminError> {
    if text.trim().is_empty() {
        return Err(AdminError::Invalid(format!("the {what} must not be blank")));
    }
    if text.contains('\0') || text.len() > 1000 {
        return Err(AdminError::Invalid(format!(
            "the {what} must be text without NUL, at most 1000 bytes"
        )));
    }
    Ok(())
}
