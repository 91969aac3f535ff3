//! What `list`, `show`, `failures`, `activity` and `key` read.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

use super::bind;
use crate::admin::{
    AdminError, AttemptRecord, FailureGroup, FilterParams, MessageSummary, MinuteActivity,
};
use crate::state::MessageStatus;

/// Lists messages of status $1 (NULL: any, `delivered` and `discarded` included) matching the
/// filter, newest first (keyset order: (created_at, seq) descending), at most $9 (NULL: all).
/// Each table is ordered and limited on its own before the merge: a branch with conditions is not
/// merged in order otherwise, so the (created_at, seq) index of the delivered history could not
/// serve a page; a page costs the same however large the history is.
const LIST: &str = concat!(
    "SELECT * FROM (( \
     SELECT t.id, t.seq, t.destination, t.status, t.downstream_key, t.ordering_key, t.attempts, \
         t.created_at, t.next_attempt_at, NULL::timestamptz AS delivered_at, t.last_error, \
         t.lease_owner, t.lease_expires_at, NULL::timestamptz AS discarded_at \
     FROM txoutbox_messages t WHERE ($1::text IS NULL OR t.status = $1) AND ",
    filter!(hot),
    " ORDER BY t.created_at DESC, t.seq DESC LIMIT $9) \
     UNION ALL ( \
     SELECT t.id, t.seq, t.destination, 'delivered', t.downstream_key, t.ordering_key, \
         t.attempts, t.created_at, NULL, t.delivered_at, NULL, NULL, NULL, NULL \
     FROM txoutbox_delivered t WHERE ($1::text IS NULL OR $1 = 'delivered') AND ",
    filter!(delivered),
    " ORDER BY t.created_at DESC, t.seq DESC LIMIT $9) \
     UNION ALL ( \
     SELECT t.id, t.seq, t.destination, 'discarded', t.downstream_key, t.ordering_key, \
         t.attempts, t.created_at, NULL, NULL, t.last_error, NULL, NULL, t.discarded_at \
     FROM txoutbox_discarded t WHERE ($1::text IS NULL OR $1 = 'discarded') AND ",
    filter!(hot),
    " ORDER BY t.created_at DESC, t.seq DESC LIMIT $9)) r \
     ORDER BY created_at DESC, seq DESC LIMIT $9"
);

/// One message, from whichever table holds it.
const SHOW: &str = "SELECT id, seq, destination, status, downstream_key, ordering_key, \
         attempts, created_at, next_attempt_at, NULL::timestamptz AS delivered_at, last_error, \
         lease_owner, lease_expires_at, NULL::timestamptz AS discarded_at, payload::text, \
         headers::text, NULL::text AS receipt \
     FROM txoutbox_messages WHERE id = $1 \
     UNION ALL \
     SELECT id, seq, destination, 'delivered', downstream_key, ordering_key, attempts, \
         created_at, NULL, delivered_at, NULL, NULL, NULL, NULL, payload::text, headers::text, \
         receipt \
     FROM txoutbox_delivered WHERE id = $1 \
     UNION ALL \
     SELECT id, seq, destination, 'discarded', downstream_key, ordering_key, attempts, \
         created_at, NULL, NULL, last_error, NULL, NULL, discarded_at, payload::text, \
         headers::text, NULL \
     FROM txoutbox_discarded WHERE id = $1";

/// A message's attempt log (relay attempts and operator actions), in the order they happened.
const HISTORY: &str = "SELECT attempt, downstream_key, relay, lease_token, outcome, error, \
         receipt, started_at, finished_at \
     FROM txoutbox_attempts WHERE message_id = $1 \
     ORDER BY started_at, finished_at, attempt";

/// Failed rows grouped by destination and normalised error text: count, first and last failure
/// (the start of the row's last attempt, which the row keeps; its enqueue time when it has none),
/// one original text; the largest groups first, at most $1. Reads the failed rows only (the
/// partial index `txoutbox_messages_dead`), not the attempt log.
const FAILURE_GROUPS: &str = concat!(
    "SELECT status, destination, class, count(*), min(failed_at), max(failed_at), \
         min(last_error) \
     FROM ( \
     SELECT t.status, t.destination, t.last_error, COALESCE(",
    normalised_error!("t.last_error"),
    ", '') AS class, COALESCE(t.attempt_started_at, t.created_at) AS failed_at \
     FROM txoutbox_messages t WHERE t.status IN ('failed', 'unknown')) g \
     GROUP BY status, destination, class \
     ORDER BY status = 'unknown' DESC, count(*) DESC, destination, class LIMIT $1"
);

/// The last $1 buckets of $2 seconds each (this one included, a bucket starting at a multiple
/// of $2 seconds since the epoch), bucket by bucket: rows delivered, failing relay attempts
/// (`retry`, `failed`, `expired`, `unknown`), and the delivery latency (delivered_at -
/// created_at, seconds) at the 50th and 99th percentiles of the bucket's deliveries.
const ACTIVITY: &str = "WITH w AS ( \
     SELECT make_interval(secs => $2) AS width, \
         to_timestamp(floor(EXTRACT(EPOCH FROM now())::float8 / $2) * $2) AS last), \
 buckets AS ( \
     SELECT generate_series(w.last - w.width * ($1 - 1), w.last, w.width) AS minute FROM w), \
 d AS ( \
     SELECT to_timestamp(floor(EXTRACT(EPOCH FROM delivered_at)::float8 / $2) * $2) AS minute, \
         count(*) AS n, \
         percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM delivered_at - created_at)) AS p50, \
         percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM delivered_at - created_at)) AS p99 \
     FROM txoutbox_delivered, w \
     WHERE delivered_at >= w.last - w.width * ($1 - 1) \
     GROUP BY 1), \
 f AS ( \
     SELECT to_timestamp(floor(EXTRACT(EPOCH FROM finished_at)::float8 / $2) * $2) AS minute, \
         count(*) AS n FROM txoutbox_attempts, w \
     WHERE finished_at >= w.last - w.width * ($1 - 1) \
       AND outcome IN ('retry', 'failed', 'expired', 'unknown') \
     GROUP BY 1) \
 SELECT buckets.minute, COALESCE(d.n, 0), COALESCE(f.n, 0), d.p50::float8, d.p99::float8 \
 FROM buckets LEFT JOIN d USING (minute) LEFT JOIN f USING (minute) ORDER BY buckets.minute";

/// One idempotency key ($1 scope, $2 key), with its claim time in microseconds since the epoch
/// (what its effects' downstream keys derive from) and whether its window has passed.
const KEY: &str = "SELECT scope, key, fingerprint, state, response_status, \
         response_headers::text, response_body, created_at, expires_at, \
         (extract(epoch FROM created_at) * 1000000)::int8, expires_at <= now() \
     FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2";

/// The inbox record of message $2 of consumer $1 (`txoutbox_inbox`).
const INBOX_RECORD: &str = "SELECT consumer, message_id, received_at, expires_at, outcome, error, \
         expires_at <= now() \
     FROM txoutbox_inbox WHERE consumer = $1 AND message_id = $2";

/// The messages a request enqueued, from whichever table holds them: those whose downstream key
/// is one derived from the claim ($2), and those written by the claim's transaction (their
/// `created_at`, the transaction's time, equals the key's, $1). Oldest first.
const KEY_MESSAGES: &str = "SELECT * FROM ( \
     SELECT t.id, t.seq, t.destination, t.status, t.downstream_key, t.ordering_key, t.attempts, \
         t.created_at, t.next_attempt_at, NULL::timestamptz AS delivered_at, t.last_error, \
         t.lease_owner, t.lease_expires_at, NULL::timestamptz AS discarded_at \
     FROM txoutbox_messages t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[]) \
     UNION ALL \
     SELECT t.id, t.seq, t.destination, 'delivered', t.downstream_key, t.ordering_key, \
         t.attempts, t.created_at, NULL, t.delivered_at, NULL, NULL, NULL, NULL \
     FROM txoutbox_delivered t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[]) \
     UNION ALL \
     SELECT t.id, t.seq, t.destination, 'discarded', t.downstream_key, t.ordering_key, \
         t.attempts, t.created_at, NULL, NULL, t.last_error, NULL, NULL, t.discarded_at \
     FROM txoutbox_discarded t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[]) \
     ) r ORDER BY created_at, seq";

/// The messages of `status` (any: `None`) the filter selects ([`LIST`]).
pub(crate) async fn list(
    client: &impl GenericClient,
    status: Option<MessageStatus>,
    filter: &FilterParams,
) -> Result<Vec<MessageSummary>, AdminError> {
    let status = status.map(MessageStatus::as_str);
    let rows = client
        .query_typed(LIST, &bind((&status, Type::TEXT), filter))
        .await?;
    rows.iter().map(summary).collect()
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
    let Some(row) = client.query_typed_opt(SHOW, &[(&id, Type::UUID)]).await? else {
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
    client
        .query_typed(HISTORY, &[(&id, Type::UUID)])
        .await?
        .iter()
        .map(|r| {
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
        .collect()
}

/// Failed rows grouped by destination and normalised error, at most `limit` groups.
pub(crate) async fn failure_groups(
    client: &impl GenericClient,
    limit: i64,
) -> Result<Vec<FailureGroup>, AdminError> {
    client
        .query_typed(FAILURE_GROUPS, &[(&limit, Type::INT8)])
        .await?
        .iter()
        .map(|r| {
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
        .collect()
}

/// The last `buckets` buckets of `width_secs` seconds, bucket by bucket ([`ACTIVITY`]).
pub(crate) async fn activity(
    client: &impl GenericClient,
    buckets: i32,
    width_secs: f64,
) -> Result<Vec<MinuteActivity>, AdminError> {
    client
        .query_typed(
            ACTIVITY,
            &[(&buckets, Type::INT4), (&width_secs, Type::FLOAT8)],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(MinuteActivity {
                minute: r.try_get(0)?,
                delivered: r.try_get::<_, i64>(1)? as u64,
                failed: r.try_get::<_, i64>(2)? as u64,
                latency_p50: r.try_get(3)?,
                latency_p99: r.try_get(4)?,
            })
        })
        .collect()
}

/// Reads an inbox record ([`INBOX_RECORD`]).
pub(crate) async fn inbox_record(
    client: &impl GenericClient,
    consumer: &str,
    message_id: &str,
) -> Result<Option<crate::admin::InboxRecord>, AdminError> {
    let Some(row) = client
        .query_typed_opt(
            INBOX_RECORD,
            &[(&consumer, Type::TEXT), (&message_id, Type::TEXT)],
        )
        .await?
    else {
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
    let Some(row) = client
        .query_typed_opt(KEY, &[(&scope, Type::TEXT), (&key, Type::TEXT)])
        .await?
    else {
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
    client
        .query_typed(
            KEY_MESSAGES,
            &[
                (claimed_at, Type::TIMESTAMPTZ),
                (&derived, Type::TEXT_ARRAY),
            ],
        )
        .await?
        .iter()
        .map(summary)
        .collect()
}

/// The 14 columns every message listing starts with.
fn summary(row: &Row) -> Result<MessageSummary, AdminError> {
    let status: MessageStatus = row.try_get::<_, String>(3)?.parse()?;
    Ok(MessageSummary {
        id: row.try_get(0)?,
        seq: row.try_get(1)?,
        destination: row.try_get(2)?,
        status,
        downstream_key: row.try_get(4)?,
        ordering_key: row.try_get(5)?,
        attempts: row.try_get(6)?,
        created_at: row.try_get(7)?,
        // Only a pending row will be tried again: a failed or unknown row keeps the column's
        // last value, which no relay acts on.
        next_attempt_at: if status == MessageStatus::Pending {
            row.try_get(8)?
        } else {
            None
        },
        delivered_at: row.try_get(9)?,
        last_error: row.try_get(10)?,
        lease_owner: row.try_get(11)?,
        lease_expires_at: row.try_get(12)?,
        discarded_at: row.try_get(13)?,
    })
}
