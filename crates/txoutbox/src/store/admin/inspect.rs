//! What `list`, `show`, `failures`, `activity` and `key` read.

use crate::store::statements::attempt_log::{ACTIVITY, HISTORY};
use crate::store::statements::idempotency_keys::SHOW as KEY;
use crate::store::statements::inbox::SHOW as INBOX_RECORD;
use crate::store::statements::messages::{
    BY_REQUEST_KEY as KEY_MESSAGES, FAILURE_GROUPS, LIST, SHOW,
};
use chrono::{DateTime, Utc};
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

use super::{bind, opt, rows};
use crate::admin::{
    AdminError, AttemptRecord, FailureGroup, FilterParams, MessageSummary, MinuteActivity,
};
use crate::state::MessageStatus;

/// The messages of `status` (any: `None`) the filter selects ([`LIST`]).
pub(crate) async fn list(
    client: &impl GenericClient,
    status: Option<MessageStatus>,
    filter: &FilterParams,
) -> Result<Vec<MessageSummary>, AdminError> {
    let status = status.map(MessageStatus::as_str);
    rows(client, LIST, &bind(&status, filter), summary).await
}

/// One message with its payload, headers and receipt ([`SHOW`]). The payload and headers come
/// as stored JSON text, decoded by the caller row by row (a document serde_json refuses must not
/// make the row unreadable).
pub(crate) struct Shown {
    pub(crate) message: MessageSummary,
    pub(crate) payload: String,
    pub(crate) headers: String,
    pub(crate) receipt: Option<String>,
}

/// The message `id`, from whichever table holds it.
pub(crate) async fn show(
    client: &impl GenericClient,
    id: Uuid,
) -> Result<Option<Shown>, AdminError> {
    let Some(row) = opt(client, SHOW, &[&id]).await? else {
        return Ok(None);
    };
    Ok(Some(Shown {
        message: summary(&row)?,
        payload: row.try_get(14)?,
        headers: row.try_get(15)?,
        receipt: row.try_get(16)?,
    }))
}

/// The attempt log of message `id` ([`HISTORY`]).
pub(crate) async fn history(
    client: &impl GenericClient,
    id: Uuid,
) -> Result<Vec<AttemptRecord>, AdminError> {
    rows(client, HISTORY, &[&id], |r| {
        Ok(AttemptRecord {
            attempt: r.try_get(0)?,
            downstream_key: r.try_get(1)?,
            relay: r.try_get(2)?,
            lease_token: r.try_get(3)?,
            outcome: r.try_get::<_, String>(4)?.parse()?,
            error: r.try_get(5)?,
            receipt: r.try_get(6)?,
            started_at: r.try_get(7)?,
            finished_at: r.try_get(8)?,
        })
    })
    .await
}

/// Failed rows grouped by destination and normalised error, at most `limit` groups.
pub(crate) async fn failure_groups(
    client: &impl GenericClient,
    limit: i64,
) -> Result<Vec<FailureGroup>, AdminError> {
    rows(client, FAILURE_GROUPS, &[&limit], |r| {
        let status: String = r.try_get(0)?;
        Ok(FailureGroup {
            status: status.parse().unwrap_or(MessageStatus::Failed),
            destination: r.try_get(1)?,
            error: r.try_get(2)?,
            count: r.try_get::<_, i64>(3)? as u64,
            first_seen: r.try_get(4)?,
            last_seen: r.try_get(5)?,
            example: r.try_get(6)?,
        })
    })
    .await
}

/// The last `buckets` buckets of `width_secs` seconds, bucket by bucket ([`ACTIVITY`]).
pub(crate) async fn activity(
    client: &impl GenericClient,
    buckets: i32,
    width_secs: f64,
) -> Result<Vec<MinuteActivity>, AdminError> {
    rows(client, ACTIVITY, &[&buckets, &width_secs], |r| {
        Ok(MinuteActivity {
            minute: r.try_get(0)?,
            delivered: r.try_get::<_, i64>(1)? as u64,
            failed: r.try_get::<_, i64>(2)? as u64,
            latency_p50: r.try_get(3)?,
            latency_p99: r.try_get(4)?,
        })
    })
    .await
}

/// Reads an inbox record ([`INBOX_RECORD`]).
pub(crate) async fn inbox_record(
    client: &impl GenericClient,
    consumer: &str,
    message_id: &str,
) -> Result<Option<crate::admin::InboxRecord>, AdminError> {
    let Some(row) = opt(client, INBOX_RECORD, &[&consumer, &message_id]).await? else {
        return Ok(None);
    };
    Ok(Some(crate::admin::InboxRecord {
        consumer: row.try_get(0)?,
        message_id: row.try_get(1)?,
        received_at: row.try_get(2)?,
        expires_at: row.try_get(3)?,
        outcome: row.try_get(4)?,
        error: row.try_get(5)?,
        expired: row.try_get(6)?,
    }))
}

/// An idempotency key's row ([`KEY`]).
pub(crate) struct KeyRow {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) state: String,
    pub(crate) response_status: Option<i16>,
    /// As stored JSON text, decoded by the caller (see [`Shown`]).
    pub(crate) response_headers: Option<String>,
    pub(crate) response_body: Option<Vec<u8>>,
    pub(crate) claimed_at: DateTime<Utc>,
    pub(crate) expires_at: DateTime<Utc>,
    /// The claim time in microseconds since the epoch.
    pub(crate) claimed_micros: i64,
    pub(crate) expired: bool,
}

/// The key (`scope`, `key`), if stored.
pub(crate) async fn key(
    client: &impl GenericClient,
    scope: &str,
    key: &str,
) -> Result<Option<KeyRow>, AdminError> {
    let Some(row) = opt(client, KEY, &[&scope, &key]).await? else {
        return Ok(None);
    };
    Ok(Some(KeyRow {
        scope: row.try_get(0)?,
        key: row.try_get(1)?,
        fingerprint: row.try_get(2)?,
        state: row.try_get(3)?,
        response_status: row.try_get(4)?,
        response_headers: row.try_get(5)?,
        response_body: row.try_get(6)?,
        claimed_at: row.try_get(7)?,
        expires_at: row.try_get(8)?,
        claimed_micros: row.try_get(9)?,
        expired: row.try_get(10)?,
    }))
}

/// The messages enqueued at `claimed_at` or carrying one of the `derived` keys ([`KEY_MESSAGES`]).
pub(crate) async fn key_messages(
    client: &impl GenericClient,
    claimed_at: &DateTime<Utc>,
    derived: &[String],
) -> Result<Vec<MessageSummary>, AdminError> {
    rows(client, KEY_MESSAGES, &[claimed_at, &derived], summary).await
}

/// The 14 columns every message listing starts with.
fn summary(row: &Row) -> Result<MessageSummary, AdminError> {
    let status: MessageStatus = row.try_get::<_, String>(3)?.parse()?;
    // Only a pending row will be tried again: a failed or unknown row keeps the column's last
    // value, which no relay acts on.
    let next_attempt_at: Option<DateTime<Utc>> = if status == MessageStatus::Pending {
        row.try_get(8)?
    } else {
        None
    };
    let waits_for_row_ahead = next_attempt_at
        .as_ref()
        .is_some_and(crate::state::waits_for_row_ahead);
    Ok(MessageSummary {
        id: row.try_get(0)?,
        seq: row.try_get(1)?,
        destination: row.try_get(2)?,
        status,
        downstream_key: row.try_get(4)?,
        ordering_key: row.try_get(5)?,
        attempts: row.try_get(6)?,
        created_at: row.try_get(7)?,
        next_attempt_at: next_attempt_at.filter(|_| !waits_for_row_ahead),
        waits_for_row_ahead,
        delivered_at: row.try_get(9)?,
        last_error: row.try_get(10)?,
        lease_owner: row.try_get(11)?,
        lease_expires_at: row.try_get(12)?,
        discarded_at: row.try_get(13)?,
    })
}
