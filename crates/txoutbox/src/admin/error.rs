//! Why an operator's action was refused or failed: one error for every command.

use chrono::{DateTime, SecondsFormat, Utc};
use uuid::Uuid;

use crate::{error::Error, state::MessageStatus};

/// Why an operator's action was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// No message has this id (in the hot table or the delivered history).
    #[error("no outbox message has id {0}")]
    NotFound(Uuid),
    /// A relay is delivering the message right now; replaying it would race the attempt.
    #[error(
        "message {id} is being delivered by relay {owner} (its lease runs until {}); \
         wait for the attempt to finish",
        .expires_at.to_rfc3339_opts(SecondsFormat::Secs, true)
    )]
    Leased {
        /// The message.
        id: Uuid,
        /// The relay holding the lease.
        owner: String,
        /// When the lease ends.
        expires_at: DateTime<Utc>,
    },
    /// The message is in a state that a replay does not change (the reason says what to do).
    #[error("message {id} is {status}: {reason}")]
    NotReplayable {
        /// The message.
        id: Uuid,
        /// Its state.
        status: MessageStatus,
        /// Why it is not replayed.
        reason: String,
    },
    /// A delivered message cannot go back with its key: the same effect was enqueued again and
    /// waits in the hot table under that key. Replay with a new key, or let the other row go.
    #[error(
        "message {id} cannot be replayed with its downstream key {downstream_key}: message \
         {other} to the same destination carries it already (replay with a new key instead)"
    )]
    KeyConflict {
        /// The delivered message.
        id: Uuid,
        /// The hot message carrying the key.
        other: Uuid,
        /// The key.
        downstream_key: String,
    },
    /// More rows were selected than the caller allowed; nothing was changed.
    #[error("{count} messages are selected, more than the {max} allowed without confirmation")]
    TooMany {
        /// Rows selected.
        count: u64,
        /// The bound given.
        max: u64,
    },
    /// The selection or the options contradict each other.
    #[error("invalid selection: {0}")]
    Invalid(String),
    /// No row, flow-control state or configured sink names this destination: most likely a typo
    /// ([`require_known_destination`](super::require_known_destination)).
    #[error(
        "no message, flow-control state or sink names destination {destination:?}{}; {}",
        if .destination.contains('*') { " (`*` is not a pattern here: name one destination)" } else { "" },
        known_list(.known)
    )]
    UnknownDestination {
        /// The name given.
        destination: String,
        /// The destinations that exist, closest to the name given first.
        known: Vec<String>,
    },
    /// Postgres could not be reached or answered with an error.
    #[error(transparent)]
    Store(#[from] Error),
}

/// How many known destinations an [`AdminError::UnknownDestination`] names in its text.
const KNOWN_SHOWN: usize = 10;

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        return "none is known yet".to_owned();
    }
    let shown = known[..known.len().min(KNOWN_SHOWN)].join(", ");
    match known.len().saturating_sub(KNOWN_SHOWN) {
        0 => format!("known destinations, closest first: {shown}"),
        more => format!("known destinations, closest first: {shown} and {more} more"),
    }
}

impl AdminError {
    /// True when the store could not be reached: nothing was decided, try again later.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, AdminError::Store(e) if e.is_unavailable())
    }
}

impl From<tokio_postgres::Error> for AdminError {
    fn from(err: tokio_postgres::Error) -> Self {
        AdminError::Store(err.into())
    }
}
