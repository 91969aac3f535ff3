//! The outbox at a glance: rows by destination and state, the oldest pending row's age, the last
//! hour's failure rate, and the destinations flow control holds back. Read in bounded time
//! however large the backlog or the history: above a size, counts are sampled or estimated.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tokio_postgres::GenericClient;

use super::{destination_flows, AdminError, DestinationFlow};
use crate::state::MessageStatus;
use crate::store::admin::{self as store, stats::Groups};

/// Up to this many delivered rows, [`stats`] counts them exactly (reading at most this many index
/// entries); above, it reports the planner's estimate, marked as such.
pub const EXACT_DELIVERED_COUNT_MAX: i64 = 10_000;

/// Up to this many hot rows (pending, in flight, failed, unknown), [`stats`] counts them exactly
/// (reading at most this many rows); above, it reports counts from a sample, marked as such.
pub const EXACT_HOT_COUNT_MAX: i64 = 100_000;

/// The window of [`OutboxStats`]'s failure rate: the last hour.
pub const FAILURE_RATE_WINDOW: Duration = Duration::from_secs(60 * 60);

/// Rows in each state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct StatusCounts {
    /// Waiting for delivery.
    pub pending: u64,
    /// Being delivered.
    pub in_flight: u64,
    /// Dead-lettered.
    pub failed: u64,
    /// Outcome lost (at-most-once).
    pub unknown: u64,
    /// Delivered and not yet purged (an estimate when [`OutboxStats::delivered_estimated`]).
    pub delivered: u64,
    /// Discarded by an operator and not yet purged.
    pub discarded: u64,
}

impl StatusCounts {
    fn add(&mut self, status: MessageStatus, n: u64) {
        match status {
            MessageStatus::Pending => self.pending += n,
            MessageStatus::InFlight => self.in_flight += n,
            MessageStatus::Failed => self.failed += n,
            MessageStatus::Unknown => self.unknown += n,
            MessageStatus::Delivered => self.delivered += n,
            MessageStatus::Discarded => self.discarded += n,
        }
    }

    /// The count of one state.
    pub fn get(&self, status: MessageStatus) -> u64 {
        match status {
            MessageStatus::Pending => self.pending,
            MessageStatus::InFlight => self.in_flight,
            MessageStatus::Failed => self.failed,
            MessageStatus::Unknown => self.unknown,
            MessageStatus::Delivered => self.delivered,
            MessageStatus::Discarded => self.discarded,
        }
    }
}

/// Relay attempts over [`FAILURE_RATE_WINDOW`] and how many of them failed (`retry`, `failed`,
/// `expired`, `unknown`; a `delivered` attempt succeeded).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct FailureRate {
    /// Attempts with an outcome.
    pub attempts: u64,
    /// Of which failed.
    pub failures: u64,
    /// failures / attempts (`None` without attempts).
    pub rate: Option<f64>,
}

impl FailureRate {
    fn new(attempts: u64, failures: u64) -> Self {
        Self {
            attempts,
            failures,
            rate: (attempts > 0).then(|| failures as f64 / attempts as f64),
        }
    }
}

/// One destination's numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DestinationStats {
    /// The destination.
    pub destination: String,
    /// Its rows by state.
    #[serde(flatten)]
    pub counts: StatusCounts,
    /// How long ago its oldest pending row was enqueued.
    #[serde(serialize_with = "secs")]
    pub oldest_pending_age: Option<Duration>,
    /// Its attempts' failure rate over the last hour.
    pub last_hour: FailureRate,
}

/// The outbox at a glance: [`stats`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxStats {
    /// By destination, in name order.
    pub destinations: Vec<DestinationStats>,
    /// All destinations together.
    pub total: StatusCounts,
    /// How long ago the oldest pending row was enqueued.
    #[serde(serialize_with = "secs")]
    pub oldest_pending_age: Option<Duration>,
    /// The failure rate of all attempts over the last hour.
    pub last_hour: FailureRate,
    /// True when the delivered counts are the planner's estimate (`pg_class.reltuples` and
    /// `pg_stats`, as of the last ANALYZE), not a count: the history holds more than
    /// [`EXACT_DELIVERED_COUNT_MAX`] rows, and counting them would scan it.
    pub delivered_estimated: bool,
    /// True when the pending counts and the per-destination oldest pending ages come from a
    /// sample of the hot table, scaled to its size: the backlog holds more than
    /// [`EXACT_HOT_COUNT_MAX`] rows, and counting them at each look would scan it. In-flight,
    /// failed and unknown rows are still counted exactly (their partial indexes are small), and
    /// [`OutboxStats::oldest_pending_age`] stays exact.
    pub hot_estimated: bool,
    /// The destinations flow control holds back or counts something for (paused, a breaker not
    /// closed or counting failures, a rate limit), by name.
    pub flow: Vec<DestinationFlow>,
    /// Requests of scopes with deferred effects whose effects are still on their key rows,
    /// waiting for a relay to fan them out (counted up to [`EXACT_HOT_COUNT_MAX`]).
    pub awaiting_fan_out: u64,
    /// How long ago the oldest of them was stored.
    #[serde(serialize_with = "secs")]
    pub oldest_awaiting_fan_out_age: Option<Duration>,
    /// The receiving side's records ([`crate::inbox`]).
    pub inbox: InboxStats,
}

/// The inbox at a glance, each count read up to [`EXACT_HOT_COUNT_MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct InboxStats {
    /// Records of received messages (live and expired).
    pub records: u64,
    /// Records whose window has passed, awaiting `txoutbox purge`.
    pub expired: u64,
    /// Messages their consumer gave up ([`crate::inbox::record_failure`]).
    pub failed: u64,
    /// True when `records` reached the bound: there are more.
    pub capped: bool,
}

/// Counts by destination and state, the oldest pending row's age, and the failure rate of the
/// last hour's attempts. The delivered history is never scanned: up to
/// [`EXACT_DELIVERED_COUNT_MAX`] rows it is counted through an index, above it the planner's
/// estimate is reported ([`OutboxStats::delivered_estimated`]).
///
/// ```
/// # async fn run(client: &tokio_postgres::Client) -> Result<(), txoutbox::admin::AdminError> {
/// let stats = txoutbox::admin::stats(client).await?;
/// for destination in &stats.destinations {
///     let counts = &destination.counts;
///     println!("{}: {} pending, {} failed", destination.destination, counts.pending, counts.failed);
/// }
/// if let Some(age) = stats.oldest_pending_age {
///     println!("oldest pending row: {} s", age.as_secs());
/// }
/// # Ok(())
/// # }
/// # txoutbox_test_support::doc_test(|mut client| async move {
/// #     txoutbox_test_support::factory::pending_many(&mut client, "email", "k", 3).await?;
/// #     run(&client).await?;
/// #     let stats = txoutbox::admin::stats(&client).await?;
/// #     assert_eq!(stats.destinations[0].counts.pending, 3);
/// #     Ok(())
/// # });
/// ```
pub async fn stats(client: &impl GenericClient) -> Result<OutboxStats, AdminError> {
    let mut by_destination: BTreeMap<String, DestinationStats> = BTreeMap::new();
    let hot_estimated = hot_counts(client, &mut by_destination).await?;
    let delivered = delivered_counts(client, &mut by_destination).await?;
    let window = FAILURE_RATE_WINDOW.as_secs_f64();
    let (mut attempts, mut failures) = (0, 0);
    for (destination, n, failed) in store::stats::attempts(client, window).await? {
        attempts += n as u64;
        failures += failed as u64;
        destination_entry(&mut by_destination, destination).last_hour =
            FailureRate::new(n as u64, failed as u64);
    }
    let mut total = StatusCounts::default();
    for stats in by_destination.values() {
        for status in MessageStatus::ALL {
            total.add(status, stats.counts.get(status));
        }
    }
    if let Some(estimated_total) = delivered {
        // The destinations the sample missed are in the total only.
        total.delivered = total.delivered.max(estimated_total);
    }
    let oldest_pending_age = if hot_estimated {
        // The sample's oldest rows are not the backlog's: read the oldest one exactly.
        store::stats::oldest_pending(client)
            .await?
            .map(|s| Duration::from_secs_f64(s.max(0.0)))
    } else {
        by_destination
            .values()
            .filter_map(|s| s.oldest_pending_age)
            .max()
    };
    let (awaiting_fan_out, oldest_awaiting) =
        store::stats::awaiting_fan_out(client, EXACT_HOT_COUNT_MAX).await?;
    Ok(OutboxStats {
        inbox: inbox_stats(client).await?,
        awaiting_fan_out: u64::try_from(awaiting_fan_out).unwrap_or(0),
        oldest_awaiting_fan_out_age: oldest_awaiting.map(|s| Duration::from_secs_f64(s.max(0.0))),
        destinations: by_destination.into_values().collect(),
        total,
        oldest_pending_age,
        last_hour: FailureRate::new(attempts, failures),
        delivered_estimated: delivered.is_some(),
        hot_estimated,
        flow: destination_flows(client)
            .await?
            .into_iter()
            .filter(DestinationFlow::is_notable)
            .collect(),
    })
}

/// The hot table's counts by destination and status, and each destination's oldest pending
/// row: exact up to [`EXACT_HOT_COUNT_MAX`] rows, else from a sample. True when sampled.
async fn hot_counts(
    client: &impl GenericClient,
    by_destination: &mut BTreeMap<String, DestinationStats>,
) -> Result<bool, AdminError> {
    let hot_bound = EXACT_HOT_COUNT_MAX + 1;
    // The planner's size of the hot table (-1: never analysed) spares a large backlog the
    // bounded exact read; a table that grew since is caught by the bound.
    let tuples = store::stats::hot_tuples(client).await?;
    let counted = if tuples > 4.0 * hot_bound as f64 {
        None
    } else {
        Some(store::stats::groups(client, Groups::Counted(hot_bound)).await?)
    };
    let exact_total: Option<i64> = counted
        .as_ref()
        .map(|groups| groups.iter().map(|g| g.count).sum());
    let hot_estimated = exact_total.is_none_or(|n| n >= hot_bound);
    let mut hot_groups = match counted {
        Some(groups) if !hot_estimated => groups,
        _ => {
            // Enough pages for about 20 000 rows, whatever the backlog's size.
            let size = tuples.max(hot_bound as f64);
            let percent = (100.0 * 20_000.0 / size).clamp(0.01, 100.0) as f32;
            let mut groups = store::stats::groups(client, Groups::Sampled(percent)).await?;
            groups.extend(store::stats::groups(client, Groups::Few).await?);
            groups
        }
    };
    hot_groups.extend(store::stats::groups(client, Groups::Discarded).await?);
    for group in hot_groups {
        let stats = destination_entry(by_destination, group.destination);
        stats.counts.add(group.status, group.count as u64);
        if group.status == MessageStatus::Pending {
            stats.oldest_pending_age = group
                .oldest_age
                .map(|s| Duration::from_secs_f64(s.max(0.0)));
        }
    }
    Ok(hot_estimated)
}

/// The history's counts by destination: exact up to [`EXACT_DELIVERED_COUNT_MAX`] rows, else
/// the planner's estimate, whose whole-table total is returned (none when exact).
async fn delivered_counts(
    client: &impl GenericClient,
    by_destination: &mut BTreeMap<String, DestinationStats>,
) -> Result<Option<u64>, AdminError> {
    let bound = EXACT_DELIVERED_COUNT_MAX + 1;
    let counted = store::stats::delivered_counts(client, bound).await?;
    if counted.iter().map(|(_, n)| n).sum::<i64>() < bound {
        for (destination, n) in counted {
            destination_entry(by_destination, destination)
                .counts
                .delivered = n as u64;
        }
        return Ok(None);
    }
    let estimate = store::stats::delivered_estimate(client).await?;
    // Never analysed (-1) or analysed while smaller: at least what was just counted.
    let tuples = estimate.tuples.max(bound as f64);
    for (destination, freq) in estimate
        .destinations
        .unwrap_or_default()
        .into_iter()
        .zip(estimate.frequencies.unwrap_or_default())
    {
        destination_entry(by_destination, destination)
            .counts
            .delivered = (freq * tuples).round() as u64;
    }
    Ok(Some(tuples.round() as u64))
}

/// The inbox's counts, each read up to [`EXACT_HOT_COUNT_MAX`].
async fn inbox_stats(client: &impl GenericClient) -> Result<InboxStats, AdminError> {
    let (records, expired, failed) = store::stats::inbox(client, EXACT_HOT_COUNT_MAX).await?;
    let as_u64 = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(InboxStats {
        records: as_u64(records),
        expired: as_u64(expired),
        failed: as_u64(failed),
        capped: records >= EXACT_HOT_COUNT_MAX,
    })
}

fn destination_entry(
    map: &mut BTreeMap<String, DestinationStats>,
    destination: String,
) -> &mut DestinationStats {
    map.entry(destination.clone())
        .or_insert_with(|| DestinationStats {
            destination,
            counts: StatusCounts::default(),
            oldest_pending_age: None,
            last_hour: FailureRate::default(),
        })
}

fn secs<S: serde::Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(d) => serializer.serialize_some(&d.as_secs_f64()),
        None => serializer.serialize_none(),
    }
}
