//! The states a message and its attempts go through, named as the columns hold them.
//!
//! States are the relay's: `pending`, `in_flight`, `failed` and `unknown` rows live in
//! `txoutbox_messages`; `delivered` rows were moved to `txoutbox_delivered` by the relay,
//! `discarded` ones to `txoutbox_discarded` by an operator's [`discard`](crate::admin::discard).

use std::str::FromStr;

use chrono::{DateTime, Datelike, Utc};
use serde::Serialize;

use crate::admin::AdminError;

/// Whether a pending row's `next_attempt_at` is the far-future instant a row is written with
/// when it waits behind an earlier row of its ordering key (9999-12-31 00:00:00+00, in
/// `messages/insert.sql`): it is not due at any time, but when the row ahead leaves.
pub(crate) fn waits_for_row_ahead(next_attempt_at: &DateTime<Utc>) -> bool {
    next_attempt_at.year() >= 9999
}

/// Where a message is in its life. The names are the `status` column's values; `delivered` rows
/// are those the relay moved to `txoutbox_delivered`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MessageStatus {
    /// Waiting for delivery: due at `next_attempt_at`, or, for a row enqueued behind an earlier
    /// row of its ordering key, once that row has left the hot table.
    Pending,
    /// Leased by a relay that is delivering it.
    InFlight,
    /// Dead-lettered: a permanent failure or too many attempts. Waits for an operator.
    Failed,
    /// An at-most-once attempt whose outcome was lost: it may or may not have happened.
    Unknown,
    /// Delivered (kept in `txoutbox_delivered` until the retention passes).
    Delivered,
    /// Closed by an operator without delivery (kept in `txoutbox_discarded`).
    Discarded,
}

impl MessageStatus {
    /// Every status, in the order of a message's life.
    pub const ALL: [MessageStatus; 6] = [
        MessageStatus::Pending,
        MessageStatus::InFlight,
        MessageStatus::Failed,
        MessageStatus::Unknown,
        MessageStatus::Delivered,
        MessageStatus::Discarded,
    ];

    /// The column value (`in_flight`, not `in-flight`).
    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Pending => "pending",
            MessageStatus::InFlight => "in_flight",
            MessageStatus::Failed => "failed",
            MessageStatus::Unknown => "unknown",
            MessageStatus::Delivered => "delivered",
            MessageStatus::Discarded => "discarded",
        }
    }
}

/// What one row of the attempt log records: the outcome of a relay's attempt, or an operator's
/// action. The names are the `outcome` column's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The downstream accepted it.
    Delivered,
    /// It failed retryably: pending again after a delay.
    Retry,
    /// Dead-lettered: a permanent failure or the last attempt allowed.
    Failed,
    /// The lease ran out mid-attempt: a relay took the row back.
    Expired,
    /// An at-most-once attempt whose outcome was lost.
    Unknown,
    /// An outcome that came after another relay took the row (not applied).
    LeaseLost,
    /// Given back at shutdown after its call started.
    Released,
    /// An operator's replay.
    Replayed,
    /// An operator's discard.
    Discarded,
    /// An operator paused the destination (a row without a message).
    Paused,
    /// An operator resumed the destination (a row without a message).
    Resumed,
}

impl AttemptOutcome {
    /// Every outcome.
    pub const ALL: [AttemptOutcome; 11] = [
        AttemptOutcome::Delivered,
        AttemptOutcome::Retry,
        AttemptOutcome::Failed,
        AttemptOutcome::Expired,
        AttemptOutcome::Unknown,
        AttemptOutcome::LeaseLost,
        AttemptOutcome::Released,
        AttemptOutcome::Replayed,
        AttemptOutcome::Discarded,
        AttemptOutcome::Paused,
        AttemptOutcome::Resumed,
    ];

    /// The column value.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Delivered => "delivered",
            AttemptOutcome::Retry => "retry",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Expired => "expired",
            AttemptOutcome::Unknown => "unknown",
            AttemptOutcome::LeaseLost => "lease_lost",
            AttemptOutcome::Released => "released",
            AttemptOutcome::Replayed => "replayed",
            AttemptOutcome::Discarded => "discarded",
            AttemptOutcome::Paused => "paused",
            AttemptOutcome::Resumed => "resumed",
        }
    }
}

impl FromStr for MessageStatus {
    type Err = AdminError;

    /// Parses a column value; `in-flight` is accepted for `in_flight`.
    fn from_str(s: &str) -> Result<Self, AdminError> {
        let column = if s == "in-flight" { "in_flight" } else { s };
        by_column_value(&Self::ALL, Self::as_str, column).ok_or_else(|| {
            AdminError::Invalid(format!(
                "{s:?} is not a status (pending, in_flight, failed, unknown, delivered, \
                 discarded)"
            ))
        })
    }
}

impl FromStr for AttemptOutcome {
    type Err = AdminError;

    /// Parses a column value.
    fn from_str(s: &str) -> Result<Self, AdminError> {
        by_column_value(&Self::ALL, Self::as_str, s)
            .ok_or_else(|| AdminError::Invalid(format!("{s:?} is not an attempt outcome")))
    }
}

display_as_str!(MessageStatus, AttemptOutcome);

/// The one of `all` whose column value is `column`.
fn by_column_value<T: Copy>(all: &[T], name: fn(T) -> &'static str, column: &str) -> Option<T> {
    all.iter().copied().find(|&value| name(value) == column)
}
