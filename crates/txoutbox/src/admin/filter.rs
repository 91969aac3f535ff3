//! Which messages a command reads or changes: a [`MessageFilter`] (with its time bounds and its
//! keyset cursor) or a list of ids ([`ReplaySelection`]), and the parameters a filter binds.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::AdminError;
#[cfg(doc)]
use super::{failure_groups, list_messages, FailureGroup, MessageSummary};
use crate::state::MessageStatus;

/// One end of a time range, compared with a message's enqueue time (`created_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBound {
    /// A point in time.
    At(DateTime<Utc>),
    /// This long before now, by the database's clock (the one that wrote `created_at`).
    Ago(Duration),
}

/// Which messages to list or replay. Every field narrows the selection; the default selects all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageFilter {
    /// Only messages in this state.
    pub status: Option<MessageStatus>,
    /// Only messages to this destination (the sink's name).
    pub destination: Option<String>,
    /// Only messages enqueued at or after this.
    pub since: Option<TimeBound>,
    /// Only messages enqueued before this.
    pub until: Option<TimeBound>,
    /// Only the message(s) carrying this downstream key.
    pub downstream_key: Option<String>,
    /// Only messages of this ordering key.
    pub ordering_key: Option<String>,
    /// Only hot messages whose last error contains this text (ignoring case).
    pub error_contains: Option<String>,
    /// Only hot messages whose last error, normalised, is this text: a group of
    /// [`failure_groups`] ([`FailureGroup::error`]; `""` for rows without an error).
    pub error_class: Option<String>,
    /// Only messages listed after this one in [`list_messages`]' order (newest first): the next
    /// page of a keyset pagination, stable while rows are inserted.
    pub before: Option<ListCursor>,
    /// At most this many messages (`None`: all).
    pub limit: Option<u64>,
}

/// A place in [`list_messages`]' order (`created_at`, then `seq`, both descending): the page
/// after it starts with the next older message. [`MessageSummary::cursor`] gives a row's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListCursor {
    /// The enqueue time of the last message seen.
    pub created_at: DateTime<Utc>,
    /// Its `seq`.
    pub seq: i64,
}

impl fmt::Display for ListCursor {
    /// `{created_at in microseconds since the epoch}.{seq}`, the form [`FromStr`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.created_at.timestamp_micros(), self.seq)
    }
}

impl FromStr for ListCursor {
    type Err = AdminError;

    fn from_str(s: &str) -> Result<Self, AdminError> {
        let invalid = || AdminError::Invalid(format!("{s:?} is not a list cursor"));
        let (micros, seq) = s.split_once('.').ok_or_else(invalid)?;
        let micros: i64 = micros.parse().map_err(|_| invalid())?;
        Ok(ListCursor {
            created_at: DateTime::from_timestamp_micros(micros).ok_or_else(invalid)?,
            seq: seq.parse().map_err(|_| invalid())?,
        })
    }
}

/// What a replay or a discard acts on.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplaySelection {
    /// These messages, all or none (see the module's replay rules).
    Ids(Vec<Uuid>),
    /// The replayable messages this filter selects.
    Filter(MessageFilter),
}

/// A filter's parameters, as the statements bind them (`store::admin` binds them).
pub(crate) struct FilterParams {
    pub(crate) destination: Option<String>,
    pub(crate) since_at: Option<DateTime<Utc>>,
    pub(crate) since_ago: Option<f64>,
    pub(crate) until_at: Option<DateTime<Utc>>,
    pub(crate) until_ago: Option<f64>,
    pub(crate) downstream_key: Option<String>,
    pub(crate) ordering_key: Option<String>,
    pub(crate) limit: Option<i64>,
    pub(crate) error_contains: Option<String>,
    pub(crate) error_class: Option<String>,
    pub(crate) before_at: Option<DateTime<Utc>>,
    pub(crate) before_seq: Option<i64>,
}

impl FilterParams {
    pub(crate) fn new(filter: &MessageFilter) -> Result<Self, AdminError> {
        let split = |bound: Option<TimeBound>| match bound {
            None => (None, None),
            Some(TimeBound::At(at)) => (Some(at), None),
            Some(TimeBound::Ago(ago)) => (None, Some(ago.as_secs_f64())),
        };
        let (since_at, since_ago) = split(filter.since);
        let (until_at, until_ago) = split(filter.until);
        let limit = filter
            .limit
            .map(|n| {
                i64::try_from(n).map_err(|_| AdminError::Invalid(format!("limit {n} is too big")))
            })
            .transpose()?;
        Ok(Self {
            destination: filter.destination.clone(),
            since_at,
            since_ago,
            until_at,
            until_ago,
            downstream_key: filter.downstream_key.clone(),
            ordering_key: filter.ordering_key.clone(),
            limit,
            error_contains: filter.error_contains.clone(),
            error_class: filter.error_class.clone(),
            before_at: filter.before.map(|c| c.created_at),
            before_seq: filter.before.map(|c| c.seq),
        })
    }
}
