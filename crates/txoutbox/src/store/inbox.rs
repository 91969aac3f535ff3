//! `txoutbox_inbox`: record a received message in the receiving transaction, read the record a
//! redelivery finds, prune expired records.

use super::statements::inbox::{COUNT_EXPIRED, LOOKUP, PRUNE_EXPIRED, RECORD, TAKE_OVER};
use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;

use super::columns::Column;
use super::driver::{Statements, StoreResult};
use super::statements::Statement;
use super::{Result, Run, TxExecutor};

/// A message to record.
pub struct Record<'a> {
    pub consumer: &'a str,
    pub message_id: &'a str,
    /// The window, in seconds.
    pub window_secs: f64,
    /// How long to wait for a concurrent delivery of the same id, as Postgres reads it.
    pub lock_timeout: &'a str,
    /// `processed`, or `failed` with `error`.
    pub outcome: &'a str,
    pub error: Option<&'a str>,
}

/// The row of [`LOOKUP`], decoded (by any driver): every column NULL when there is no record.
pub struct FoundRecord {
    pub received_at: Option<DateTime<Utc>>,
    pub outcome: Option<String>,
    pub live: Option<bool>,
}

impl FoundRecord {
    /// Decodes [`LOOKUP`]'s row, from whichever driver.
    pub(crate) fn decode<R>(row: &R) -> std::result::Result<Self, R::Error>
    where
        R: Column<Option<DateTime<Utc>>> + Column<Option<String>> + Column<Option<bool>>,
    {
        Ok(FoundRecord {
            received_at: row.column(0)?,
            outcome: row.column(1)?,
            live: row.column(2)?,
        })
    }
}

/// What [`record`] found.
pub(crate) enum Recorded {
    /// The record is this transaction's, received at this time.
    New(DateTime<Utc>),
    /// A live record of another transaction's: when it was received, and its outcome.
    Found(DateTime<Utc>, String),
    /// A record stopped the insert, then was gone before it could be read (pruned), or was
    /// taken over by a concurrent delivery that committed after this one's read.
    Vanished,
}

/// How a record is written: inserted ([`RECORD`], waiting at most the record's lock timeout for
/// a concurrent delivery of the same id), or over an expired one ([`TAKE_OVER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Insert,
    TakeOver,
}

impl Write {
    pub(crate) fn statement(self) -> Statement {
        match self {
            Write::Insert => RECORD,
            Write::TakeOver => TAKE_OVER,
        }
    }
}

/// Records a message ([`RECORD`]), or reads the live record that holds its id ([`LOOKUP`]), or
/// takes over an expired one ([`TAKE_OVER`]), on any driver of the write path. The error of a
/// lock timeout or a serialization failure is the database's, for the caller to read its
/// SQLSTATE.
pub(crate) async fn record(tx: &mut impl Statements, r: &Record<'_>) -> StoreResult<Recorded> {
    if let Some(received) = tx.inbox_write(r, Write::Insert).await? {
        return Ok(Recorded::New(received));
    }
    let Some(found) = tx.inbox_lookup(r.consumer, r.message_id).await? else {
        return Ok(Recorded::Vanished);
    };
    match (found.received_at, found.outcome, found.live) {
        (Some(received), Some(outcome), Some(true)) => Ok(Recorded::Found(received, outcome)),
        (Some(_), Some(_), Some(false)) => match tx.inbox_write(r, Write::TakeOver).await? {
            Some(received) => Ok(Recorded::New(received)),
            None => Ok(Recorded::Vanished),
        },
        _ => Ok(Recorded::Vanished),
    }
}

impl Record<'_> {
    /// The parameters of `write`'s statement: $1..$5 the record, as both statements take them,
    /// then [`RECORD`]'s lock timeout ($6).
    fn params(&self, write: Write) -> Vec<&(dyn ToSql + Sync)> {
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &self.consumer,
            &self.message_id,
            &self.window_secs,
            &self.outcome,
            &self.error,
        ];
        if write == Write::Insert {
            params.push(&self.lock_timeout);
        }
        params
    }
}

/// [`RECORD`] or [`TAKE_OVER`] on tokio-postgres: the time of the record written, `None` when a
/// record holds the id (an insert) or a concurrent delivery took it first (a take-over).
pub(crate) async fn write(
    tx: &impl TxExecutor,
    r: &Record<'_>,
    write: Write,
) -> Result<Option<DateTime<Utc>>> {
    let rows = tx.run(write.statement(), &r.params(write)).await?;
    rows.first().map(|row| row.try_get(0)).transpose()
}

/// [`LOOKUP`] on tokio-postgres.
pub(crate) async fn lookup(
    tx: &impl TxExecutor,
    consumer: &str,
    message_id: &str,
) -> Result<Option<FoundRecord>> {
    let rows = tx.run(LOOKUP, &[&consumer, &message_id]).await?;
    rows.first().map(FoundRecord::decode).transpose()
}

/// Deletes up to `batch` expired records; returns how many.
pub(crate) async fn prune_expired(conn: &impl TxExecutor, batch: i64) -> Result<u64> {
    let rows = conn.run(PRUNE_EXPIRED, &[&batch]).await?;
    Ok(rows.len() as u64)
}

/// How many records have expired ([`COUNT_EXPIRED`]).
pub(crate) async fn count_expired(conn: &impl TxExecutor) -> Result<u64> {
    let rows = conn.run(COUNT_EXPIRED, &[]).await?;
    let n: i64 = match rows.first() {
        Some(row) => row.try_get(0)?,
        None => 0,
    };
    Ok(u64::try_from(n).unwrap_or(0))
}
