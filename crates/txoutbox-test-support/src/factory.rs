//! Outbox rows for tests, in any state, in one call (as River's `testfactory` builds jobs):
//!
//! ```no_run
//! # async fn f(db: &txoutbox_test_support::TestDb) -> anyhow::Result<()> {
//! use txoutbox::admin::MessageStatus;
//! use txoutbox_test_support::factory::message;
//!
//! let id = message(db).destination("x").status(MessageStatus::Failed).create().await?;
//! # let _ = id; Ok(()) }
//! ```
//!
//! Rows are enqueued with `txoutbox::enqueue` (so deduplication, ordering locks and the wake-up
//! hint are the real ones), then the columns a relay would have written are set in the same
//! transaction.

use std::time::Duration;

use anyhow::{bail, Result};
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Client;
use txoutbox::{admin::MessageStatus, OutboxMessage};
use uuid::Uuid;

use crate::TestDb;

/// Where the factory writes: a test's database (a connection per call) or a client it holds.
pub enum Target<'a> {
    /// A new connection to this database for each `create`.
    Db(&'a TestDb),
    /// This connection.
    Client(&'a mut Client),
}

impl<'a> From<&'a TestDb> for Target<'a> {
    fn from(db: &'a TestDb) -> Self {
        Target::Db(db)
    }
}

impl<'a> From<&'a mut Client> for Target<'a> {
    fn from(client: &'a mut Client) -> Self {
        Target::Client(client)
    }
}

/// A payload made from a row's downstream key and its index in [`MessageFactory::create_many`].
type PayloadFn = dyn Fn(&str, usize) -> Value + Send + Sync;

/// Builds one row of `txoutbox_messages` (or many alike); see [`message`].
pub struct MessageFactory<'a> {
    target: Target<'a>,
    destination: String,
    key: Option<String>,
    payload: Option<Box<PayloadFn>>,
    ordering_key: Option<String>,
    headers: Vec<(String, String)>,
    status: Option<MessageStatus>,
    attempts: Option<i32>,
    next_attempt_at: Option<DateTime<Utc>>,
    created_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    stored_payload: Option<String>,
    stored_headers: Option<String>,
}

/// A pending row to `test`, downstream key a fresh UUIDv7, payload `{"key": <downstream key>}`;
/// set what the test cares about, then [`create`](MessageFactory::create).
pub fn message<'a>(target: impl Into<Target<'a>>) -> MessageFactory<'a> {
    MessageFactory {
        target: target.into(),
        destination: "test".to_owned(),
        key: None,
        payload: None,
        ordering_key: None,
        headers: Vec::new(),
        status: None,
        attempts: None,
        next_attempt_at: None,
        created_at: None,
        last_error: None,
        stored_payload: None,
        stored_headers: None,
    }
}

/// A pending row to `destination` with downstream key `key`, written now; its id. Short for
/// `message(target).destination(destination).key(key).create()`.
pub async fn pending<'a>(
    target: impl Into<Target<'a>>,
    destination: &str,
    key: &str,
) -> Result<Uuid> {
    message(target)
        .destination(destination)
        .key(key)
        .create()
        .await
}

/// A pending row to `destination` with downstream key `key` and ordering key `ordering_key`,
/// written now; its id. Short for
/// `message(target).destination(destination).key(key).ordering_key(ordering_key).create()`.
pub async fn pending_ordered<'a>(
    target: impl Into<Target<'a>>,
    destination: &str,
    key: &str,
    ordering_key: &str,
) -> Result<Uuid> {
    let row = message(target).destination(destination).key(key);
    row.ordering_key(ordering_key).create().await
}

/// `n` pending rows to `destination`, downstream keys `{key}-{i}`, written now; their ids. Short
/// for `message(target).destination(destination).key(key).create_many(n)`.
pub async fn pending_many<'a>(
    target: impl Into<Target<'a>>,
    destination: &str,
    key: &str,
    n: usize,
) -> Result<Vec<Uuid>> {
    message(target)
        .destination(destination)
        .key(key)
        .create_many(n)
        .await
}

impl MessageFactory<'_> {
    /// The destination (the sink that delivers it).
    pub fn destination(mut self, destination: &str) -> Self {
        self.destination = destination.to_owned();
        self
    }

    /// The downstream key (with [`create_many`](Self::create_many): the prefix of `{key}-{i}`).
    pub fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    /// The payload.
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(Box::new(move |_, _| payload.clone()));
        self
    }

    /// A payload made from each row's downstream key and index.
    pub fn payload_with(
        mut self,
        payload: impl Fn(&str, usize) -> Value + Send + Sync + 'static,
    ) -> Self {
        self.payload = Some(Box::new(payload));
        self
    }

    /// The ordering key.
    pub fn ordering_key(mut self, key: &str) -> Self {
        self.ordering_key = Some(key.to_owned());
        self
    }

    /// A header forwarded to the sink (`traceparent`, ...).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The status; a row of the hot table only (`pending`, `in_flight`, `failed`, `unknown`).
    pub fn status(mut self, status: MessageStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// The attempts made so far.
    pub fn attempts(mut self, attempts: i32) -> Self {
        self.attempts = Some(attempts);
        self
    }

    /// When the row is next due.
    pub fn next_attempt_at(mut self, at: DateTime<Utc>) -> Self {
        self.next_attempt_at = Some(at);
        self
    }

    /// Due `after` from now.
    pub fn due_in(self, after: Duration) -> Self {
        let at = Utc::now() + chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
        self.next_attempt_at(at)
    }

    /// When the row was created.
    pub fn created_at(mut self, at: DateTime<Utc>) -> Self {
        self.created_at = Some(at);
        self
    }

    /// Created `ago` before now.
    pub fn created_ago(self, ago: Duration) -> Self {
        let at = Utc::now() - chrono::Duration::from_std(ago).unwrap_or(chrono::Duration::MAX);
        self.created_at(at)
    }

    /// The last error recorded.
    pub fn last_error(mut self, error: &str) -> Self {
        self.last_error = Some(error.to_owned());
        self
    }

    /// The payload as stored JSON text, written over the enqueued one as another program would:
    /// any JSON Postgres accepts, also what serde_json refuses (nesting deeper than 128, `1e400`).
    pub fn stored_payload(mut self, json: &str) -> Self {
        self.stored_payload = Some(json.to_owned());
        self
    }

    /// The headers as stored JSON text, written over the enqueued ones (see
    /// [`stored_payload`](Self::stored_payload)).
    pub fn stored_headers(mut self, json: &str) -> Self {
        self.stored_headers = Some(json.to_owned());
        self
    }

    /// Writes the row (committed); its id.
    pub async fn create(self) -> Result<Uuid> {
        let key = self
            .key
            .clone()
            .unwrap_or_else(|| Uuid::now_v7().to_string());
        let ids = self.write(vec![key]).await?;
        Ok(ids[0])
    }

    /// Writes `n` rows alike, downstream keys `{key}-{i}` (`key` defaults to `k`), committed in
    /// transactions of 500; their ids.
    pub async fn create_many(self, n: usize) -> Result<Vec<Uuid>> {
        let prefix = self.key.clone().unwrap_or_else(|| "k".to_owned());
        self.write((0..n).map(|i| format!("{prefix}-{i}")).collect())
            .await
    }

    async fn write(mut self, keys: Vec<String>) -> Result<Vec<Uuid>> {
        if let Some(status) = self.status {
            if matches!(status, MessageStatus::Delivered | MessageStatus::Discarded) {
                bail!("the factory writes rows of txoutbox_messages, not {status} ones");
            }
        }
        let mut own;
        let client: &mut Client = match &mut self.target {
            Target::Db(db) => {
                own = db.connect().await?;
                &mut own
            }
            Target::Client(client) => client,
        };
        let mut ids = Vec::with_capacity(keys.len());
        for (chunk_no, chunk) in keys.chunks(500).enumerate() {
            let tx = client.transaction().await?;
            let mut messages = Vec::with_capacity(chunk.len());
            for (j, key) in chunk.iter().enumerate() {
                let i = chunk_no * 500 + j;
                let payload = match &self.payload {
                    Some(payload) => payload(key, i),
                    None => serde_json::json!({ "key": key }),
                };
                let mut m = OutboxMessage::new(&self.destination, &payload)?
                    .with_downstream_key(key.clone());
                if let Some(ordering) = &self.ordering_key {
                    m = m.with_ordering_key(ordering.clone());
                }
                for (name, value) in &self.headers {
                    m = m.with_header(name.clone(), value.clone());
                }
                messages.push(m);
            }
            txoutbox::enqueue(&tx, &messages).await?;
            let chunk_ids: Vec<Uuid> = messages.iter().map(OutboxMessage::id).collect();
            if self.status.is_some()
                || self.attempts.is_some()
                || self.next_attempt_at.is_some()
                || self.created_at.is_some()
                || self.last_error.is_some()
            {
                let status = self.status.map(MessageStatus::as_str);
                tx.execute(
                    "UPDATE txoutbox_messages SET \
                         status = coalesce($2, status), \
                         attempts = coalesce($3, attempts), \
                         next_attempt_at = coalesce($4, next_attempt_at), \
                         created_at = coalesce($5, created_at), \
                         last_error = coalesce($6, last_error) \
                     WHERE id = ANY($1)",
                    &[
                        &chunk_ids,
                        &status,
                        &self.attempts,
                        &self.next_attempt_at,
                        &self.created_at,
                        &self.last_error,
                    ],
                )
                .await?;
            }
            if self.stored_payload.is_some() || self.stored_headers.is_some() {
                tx.execute(
                    "UPDATE txoutbox_messages SET \
                         payload = coalesce($2::text::jsonb, payload), \
                         headers = coalesce($3::text::jsonb, headers) \
                     WHERE id = ANY($1)",
                    &[&chunk_ids, &self.stored_payload, &self.stored_headers],
                )
                .await?;
            }
            tx.commit().await?;
            ids.extend(chunk_ids);
        }
        Ok(ids)
    }
}

/// A fresh test database holding `n` pending rows to `destination` (downstream keys
/// `{key}-{i}`), and a connection to it: the arrangement most relay tests open with.
pub async fn db_with_pending(destination: &str, key: &str, n: usize) -> Result<(TestDb, Client)> {
    let db = crate::test_db().await?;
    let mut client = db.connect().await?;
    pending_many(&mut client, destination, key, n).await?;
    Ok((db, client))
}

/// A JSON array nested 200 deep: Postgres stores it, serde_json stops at 128 (a stored payload or
/// header no relay, CLI or dashboard can decode).
pub fn nested_too_deep() -> String {
    format!("{}1{}", "[".repeat(200), "]".repeat(200))
}
