//! The operator's tools: list, show, replay, discard, purge, stats and relays. The `txoutbox` command is a
//! thin shell over these functions, so a service (an admin endpoint, a scheduled purge) runs the
//! same code. One file a command; [`MessageFilter`] selects the rows, [`AdminError`] says no.

mod discard;
mod error;
mod filter;
mod flow;
mod inspect;
mod known;
mod purge;
mod refusals;
mod relays;
mod replay;
mod stats;
mod stored;
#[cfg(test)]
mod tests;

pub use crate::migrate::{embedded_migrations, migrate_to, HISTORY_TABLE};
pub use crate::state::{AttemptOutcome, MessageStatus};
pub use discard::{discard, DiscardOptions, DiscardReport, DiscardedMessage};
pub use error::AdminError;
pub(crate) use filter::FilterParams;
pub use filter::{ListCursor, MessageFilter, ReplaySelection, TimeBound};
pub use flow::{destination_flows, pause_destination, resume_destination, DestinationFlow};
pub use inspect::{
    activity, activity_buckets, failure_groups, list_messages, lookup_inbox, lookup_key,
    show_message, AttemptRecord, FailureGroup, IdempotencyRecord, InboxLookup, InboxRecord,
    KeyLookup, MessageDetail, MessageSummary, MinuteActivity,
};
pub use known::{destination_matches, require_known_destination};
pub use purge::{
    prune_expired_inbox, prune_expired_keys, purge, PurgeOptions, PurgeReport, Retention,
    DEFAULT_FAILED_RETENTION, DEFAULT_PRUNE_BATCH, DEFAULT_RETENTION,
};
pub use relays::{relays, RelayRecord};
pub use replay::{
    replay, replay_downstream_key, ReplayOptions, ReplayReport, ReplayedMessage, SkippedMessage,
};
pub use stats::{
    stats, DestinationStats, FailureRate, InboxStats, OutboxStats, StatusCounts,
    EXACT_DELIVERED_COUNT_MAX, EXACT_HOT_COUNT_MAX, FAILURE_RATE_WINDOW,
};
pub use stored::StoredJson;

/// How many rows a replay by filter changes per transaction by default.
pub const DEFAULT_REPLAY_BATCH: usize = 500;

/// Tells a long command's caller how far it got: (rows done, rows in all).
fn tell(progress: &mut Option<&mut (dyn FnMut(u64, u64) + Send)>, done: u64, total: u64) {
    if let Some(progress) = progress {
        progress(done, total);
    }
}
