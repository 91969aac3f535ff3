//! `relays`: the relays that recorded themselves in `txoutbox_relays`, alive or stale. A relay
//! refreshes its row every heartbeat (`RelayConfig::heartbeat_interval`) and deletes it at a
//! clean exit; one whose heartbeat is three intervals old is stale (killed, its machine lost,
//! cut off from the database), and its row is pruned by the other relays a day later.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::GenericClient;

use super::AdminError;
use crate::store;

/// A relay as it last recorded itself: [`relays`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelayRecord {
    /// Its owner name, as in leases and the attempt log.
    pub owner: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id on that host.
    pub pid: i32,
    /// The txoutbox version it runs.
    pub version: String,
    /// When it started (its first heartbeat).
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// How often it beats, in seconds.
    pub heartbeat_every_secs: f64,
    /// Its last claim that took rows (none yet: `None`).
    pub last_claim_at: Option<DateTime<Utc>>,
    /// Rows it held under a lease at its last heartbeat.
    pub held: u64,
    /// The destinations it has sinks for.
    pub sinks: Vec<String>,
    /// Its flow bounds: `concurrency`, `batch_size`, and under `destinations` each bounded
    /// destination's `rate_per_sec`, `burst`, `max_in_flight`, `at_most_once`.
    pub flow: serde_json::Value,
    /// Three heartbeats missed: the process is most likely gone.
    pub stale: bool,
    /// Seconds since it started, by the database's clock.
    pub started_age_secs: f64,
    /// Seconds since its last heartbeat, by the database's clock.
    pub heartbeat_age_secs: f64,
    /// Seconds since its last claim that took rows.
    pub last_claim_age_secs: Option<f64>,
}

/// Every relay that recorded itself, alive ones first, by host and start.
pub async fn relays(client: &impl GenericClient) -> Result<Vec<RelayRecord>, AdminError> {
    store::relays::list(client).await
}
