//! What `stats` reads: bounded counts, samples and the planner's estimates.

use crate::store::statements::attempt_log::STATS as STATS_ATTEMPTS;
use crate::store::statements::delivered::{
    STATS_ESTIMATE as STATS_DELIVERED_ESTIMATE, STATS_EXACT as STATS_DELIVERED_EXACT,
};
use crate::store::statements::discarded::STATS_COUNTS as STATS_DISCARDED;
use crate::store::statements::idempotency_keys::STATS_FAN_OUT;
use crate::store::statements::inbox::STATS as STATS_INBOX;
use crate::store::statements::messages::{
    STATS_COUNTS, STATS_FEW as STATS_HOT_FEW, STATS_OLDEST_PENDING,
    STATS_SAMPLE as STATS_HOT_SAMPLE, STATS_TUPLES as STATS_HOT_TUPLES,
};
use tokio_postgres::{GenericClient, Row};

use super::{one, rows, value};
use crate::admin::AdminError;
use crate::state::MessageStatus;

/// Rows of one destination and status.
pub(crate) struct Group {
    pub(crate) destination: String,
    pub(crate) status: MessageStatus,
    pub(crate) count: i64,
    /// Seconds since the group's oldest row was enqueued (where read).
    pub(crate) oldest_age: Option<f64>,
}

/// Where [`groups`] reads.
pub(crate) enum Groups {
    /// Hot rows, reading at most this many ([`STATS_COUNTS`]).
    Counted(i64),
    /// Pending rows from a sample of this percent of the pages ([`STATS_HOT_SAMPLE`]).
    Sampled(f32),
    /// In-flight, failed and unknown rows ([`STATS_HOT_FEW`]).
    Few,
    /// Discarded rows ([`STATS_DISCARDED`]).
    Discarded,
}

/// Rows by destination and status.
pub(crate) async fn groups(
    client: &impl GenericClient,
    groups: Groups,
) -> Result<Vec<Group>, AdminError> {
    match groups {
        Groups::Counted(bound) => rows(client, STATS_COUNTS, &[&bound], group).await,
        Groups::Sampled(percent) => rows(client, STATS_HOT_SAMPLE, &[&percent], group).await,
        Groups::Few => rows(client, STATS_HOT_FEW, &[], group).await,
        Groups::Discarded => rows(client, STATS_DISCARDED, &[], group).await,
    }
}

fn group(row: &Row) -> Result<Group, AdminError> {
    Ok(Group {
        destination: row.try_get(0)?,
        status: row.try_get::<_, String>(1)?.parse()?,
        count: row.try_get(2)?,
        oldest_age: row.try_get(3)?,
    })
}

/// The hot table's size as the planner saw it ([`STATS_HOT_TUPLES`]).
pub(crate) async fn hot_tuples(client: &impl GenericClient) -> Result<f64, AdminError> {
    value(client, STATS_HOT_TUPLES, &[]).await
}

/// Seconds since the oldest pending row was enqueued ([`STATS_OLDEST_PENDING`]).
pub(crate) async fn oldest_pending(client: &impl GenericClient) -> Result<Option<f64>, AdminError> {
    value(client, STATS_OLDEST_PENDING, &[]).await
}

/// Keys carrying effects not fanned out yet, up to `bound`, and the oldest one's age in seconds
/// ([`STATS_FAN_OUT`]).
pub(crate) async fn awaiting_fan_out(
    client: &impl GenericClient,
    bound: i64,
) -> Result<(i64, Option<f64>), AdminError> {
    let row = one(client, STATS_FAN_OUT, &[&bound]).await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// Delivered rows by destination, reading at most `bound` ([`STATS_DELIVERED_EXACT`]).
pub(crate) async fn delivered_counts(
    client: &impl GenericClient,
    bound: i64,
) -> Result<Vec<(String, i64)>, AdminError> {
    rows(client, STATS_DELIVERED_EXACT, &[&bound], |row| {
        Ok((row.try_get(0)?, row.try_get(1)?))
    })
    .await
}

/// The planner's estimate of the delivered history ([`STATS_DELIVERED_ESTIMATE`]).
pub(crate) struct DeliveredEstimate {
    pub(crate) tuples: f64,
    pub(crate) destinations: Option<Vec<String>>,
    pub(crate) frequencies: Option<Vec<f64>>,
}

/// Reads the planner's estimate of the delivered history.
pub(crate) async fn delivered_estimate(
    client: &impl GenericClient,
) -> Result<DeliveredEstimate, AdminError> {
    let row = one(client, STATS_DELIVERED_ESTIMATE, &[]).await?;
    Ok(DeliveredEstimate {
        tuples: row.try_get(0)?,
        destinations: row.try_get(1)?,
        frequencies: row.try_get(2)?,
    })
}

/// Relay attempts of the last `window` seconds, by destination: (destination, attempts, failed)
/// ([`STATS_ATTEMPTS`]).
pub(crate) async fn attempts(
    client: &impl GenericClient,
    window: f64,
) -> Result<Vec<(String, i64, i64)>, AdminError> {
    rows(client, STATS_ATTEMPTS, &[&window], |row| {
        Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
    })
    .await
}

/// Inbox records, expired ones and given-up ones, each counted up to `bound` ([`STATS_INBOX`]).
pub(crate) async fn inbox(
    client: &impl GenericClient,
    bound: i64,
) -> Result<(i64, i64, i64), AdminError> {
    let row = one(client, STATS_INBOX, &[&bound]).await?;
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}
