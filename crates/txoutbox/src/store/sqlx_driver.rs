//! The write path on sqlx (the `sqlx` feature): the same statements as tokio-postgres's, from
//! `store::keys`, `store::messages` and `store::wake`, run on a `sqlx::PgConnection` inside the
//! caller's transaction, their rows decoded into the library's own.
//!
//! sqlx has no pipelining: where tokio-postgres sends two statements in one round trip, this
//! sends them one after the other. The key's lock and lookup take two round trips instead of
//! one (three when another request holds the key, as on tokio-postgres), and `Claim::commit`
//! two (the statement, then COMMIT) instead of one. Statements are prepared once per connection
//! (sqlx's statement cache), as deadpool's are.

use std::future::Future;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Postgres, Row};
use sqlx_core::transaction::TransactionManager;

use super::driver::{locked, FoundRow, LockRow};
use super::driver::{BusinessRows, Committing, Statements, StoreError, StoreResult};
use super::inbox::{FoundRecord, Record, Write};
use super::keys::{ClaimKey, CompleteKey, Locked, Refused};
use super::messages::{Inserted, MessageColumns};
use super::statements::{self, idempotency_keys};

/// A sqlx error as the library's: unreachable (503), a conflict (409), or the database's.
pub(crate) fn error(e: sqlx::Error) -> crate::Error {
    let (code, message) = match &e {
        sqlx::Error::Database(db) => (
            db.code().map(|c| c.into_owned()).unwrap_or_default(),
            db.message().to_owned(),
        ),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => {
            return crate::Error::StoreUnavailable {
                message: e.to_string(),
                source: Some(Box::new(e)),
            }
        }
        _ => {
            return crate::Error::Driver {
                message: e.to_string(),
                source: Box::new(e),
            }
        }
    };
    if matches!(code.as_str(), "40001" | "40P01") {
        return crate::Error::Conflict {
            message,
            source: Some(Box::new(e)),
        };
    }
    if code.starts_with("08") || matches!(code.as_str(), "57P01" | "57P02" | "57P03" | "53300") {
        return crate::Error::StoreUnavailable {
            message,
            source: Some(Box::new(e)),
        };
    }
    crate::Error::Driver {
        message: crate::error::server_message(&code, &message),
        source: Box::new(e),
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Sqlx(e)
    }
}

/// The key's lock, then the lookup behind it (two round trips; `idempotency_keys/lock_wait.sql` and
/// `idempotency_keys/lookup_restore.sql` when another request holds the lock).
async fn lock_and_lookup(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
    lock_timeout: &str,
) -> StoreResult<Option<Locked>> {
    // Each statement takes the key as $1, $2 (the wait its timeout as $3).
    let on_key =
        |statement: statements::Statement| sqlx::query(statement.sql).bind(scope).bind(key);
    let tried = on_key(idempotency_keys::LOCK_TRY)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(tried) = tried else {
        return Ok(None);
    };
    let (lock, found) = if tried.try_get::<bool, _>(0)? {
        let found = on_key(idempotency_keys::LOOKUP)
            .fetch_optional(&mut *conn)
            .await?;
        (tried, found)
    } else {
        let waited = on_key(idempotency_keys::LOCK_WAIT)
            .bind(lock_timeout)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(waited) = waited else {
            return Ok(None);
        };
        let found = on_key(idempotency_keys::LOOKUP_RESTORE)
            .fetch_optional(&mut *conn)
            .await?;
        (waited, found)
    };
    let lock = LockRow::decode(&lock)?;
    let found = found.as_ref().map(FoundRow::decode).transpose()?;
    Ok(Some(locked(lock, found)))
}

async fn claim_key(conn: &mut PgConnection, claim: &ClaimKey<'_>) -> StoreResult<bool> {
    let rows = sqlx::query(idempotency_keys::CLAIM.sql)
        .bind(claim.scope)
        .bind(claim.key)
        .bind(claim.fingerprint)
        .bind(claim.window_secs)
        .bind(claim.lock_timeout)
        .fetch_all(&mut *conn)
        .await?;
    Ok(!rows.is_empty())
}

/// Binds a batch's columns, in the order both insert statements take them.
fn bind_columns<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    rows: &'q MessageColumns,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(&rows.ids)
        .bind(&rows.destinations)
        .bind(&rows.payloads)
        .bind(&rows.headers)
        .bind(&rows.downstream_keys)
        .bind(&rows.ordering_keys)
}

async fn complete_key(
    conn: &mut PgConnection,
    complete: &CompleteKey<'_>,
) -> StoreResult<Option<Inserted>> {
    let mut query = sqlx::query(complete.statement().sql)
        .bind(complete.scope)
        .bind(complete.key)
        .bind(complete.fingerprint)
        .bind(complete.status)
        .bind(complete.headers)
        .bind(complete.body)
        .bind(complete.window_secs)
        .bind(complete.effects)
        .bind(complete.backend_pid)
        .bind(complete.claimed_at)
        .bind(complete.outermost);
    if !complete.messages.ids.is_empty() {
        query = bind_columns(query, complete.messages);
    }
    let Some(row) = query.fetch_optional(&mut *conn).await? else {
        return Ok(None);
    };
    let ids: Option<Vec<uuid::Uuid>> = row.try_get(0)?;
    let destinations: Option<Vec<String>> = row.try_get(1)?;
    Ok(Some(Inserted {
        ids: ids.unwrap_or_default(),
        destinations: destinations.unwrap_or_default(),
    }))
}

async fn insert_messages(conn: &mut PgConnection, rows: &MessageColumns) -> StoreResult<Inserted> {
    let inserted = bind_columns(sqlx::query(rows.insert().sql), rows)
        .fetch_all(&mut *conn)
        .await?;
    Ok(Inserted::decode(&inserted)?)
}

async fn lock_ordering_keys(conn: &mut PgConnection, keys: &[&str]) -> StoreResult<()> {
    sqlx::query(statements::messages::LOCK_ORDERING_KEYS.sql)
        .bind(keys)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn notify(conn: &mut PgConnection) -> StoreResult<()> {
    sqlx::query(statements::session::NOTIFY.sql)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// `write`'s statement: the record ($1..$5, as both statements take it), then [`RECORD`]'s lock
/// timeout ($6).
///
/// [`RECORD`]: statements::inbox::RECORD
async fn inbox_write(
    conn: &mut PgConnection,
    r: &Record<'_>,
    write: Write,
) -> StoreResult<Option<DateTime<Utc>>> {
    let mut query = sqlx::query(write.statement().sql)
        .bind(r.consumer)
        .bind(r.message_id)
        .bind(r.window_secs)
        .bind(r.outcome)
        .bind(r.error);
    if write == Write::Insert {
        query = query.bind(r.lock_timeout);
    }
    let row = query.fetch_optional(&mut *conn).await?;
    Ok(row.map(|row| row.try_get(0)).transpose()?)
}

async fn inbox_lookup(
    conn: &mut PgConnection,
    consumer: &str,
    message_id: &str,
) -> StoreResult<Option<FoundRecord>> {
    let row = sqlx::query(statements::inbox::LOOKUP.sql)
        .bind(consumer)
        .bind(message_id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.as_ref().map(FoundRecord::decode).transpose()?)
}

/// The statements on a sqlx connection inside a transaction: the same for a bare connection and
/// a `sqlx::Transaction` (each derefs to the connection).
macro_rules! statements_on {
    ($(#[$doc:meta])* $ty:ty) => {
        $(#[$doc])*
        impl Statements for $ty {
            fn lock_and_lookup<'a>(
                &'a mut self,
                scope: &'a str,
                key: &'a str,
                lock_timeout: &'a str,
            ) -> impl Future<Output = StoreResult<Option<Locked>>> + Send + 'a {
                lock_and_lookup(self, scope, key, lock_timeout)
            }

            fn claim_key<'a>(
                &'a mut self,
                claim: &'a ClaimKey<'a>,
            ) -> impl Future<Output = StoreResult<bool>> + Send + 'a {
                claim_key(self, claim)
            }

            fn complete_key<'a>(
                &'a mut self,
                complete: &'a CompleteKey<'a>,
            ) -> impl Future<Output = StoreResult<Option<Inserted>>> + Send + 'a {
                complete_key(self, complete)
            }

            fn insert_messages<'a>(
                &'a mut self,
                rows: &'a MessageColumns,
            ) -> impl Future<Output = StoreResult<Inserted>> + Send + 'a {
                insert_messages(self, rows)
            }

            fn lock_ordering_keys<'a>(
                &'a mut self,
                keys: &'a [&'a str],
            ) -> impl Future<Output = StoreResult<()>> + Send + 'a {
                lock_ordering_keys(self, keys)
            }

            fn notify(&mut self) -> impl Future<Output = StoreResult<()>> + Send + '_ {
                notify(self)
            }

            fn inbox_write<'a>(
                &'a mut self,
                record: &'a Record<'a>,
                write: Write,
            ) -> impl Future<Output = StoreResult<Option<DateTime<Utc>>>> + Send + 'a {
                inbox_write(self, record, write)
            }

            fn inbox_lookup<'a>(
                &'a mut self,
                consumer: &'a str,
                message_id: &'a str,
            ) -> impl Future<Output = StoreResult<Option<FoundRecord>>> + Send + 'a {
                inbox_lookup(self, consumer, message_id)
            }
        }
    };
}

statements_on!(
    /// The statements on a connection inside a transaction (the caller's `BEGIN`, or a
    /// `sqlx::Transaction`'s).
    &mut PgConnection
);
statements_on!(
    /// The statements in a `sqlx::Transaction` (or a savepoint: one nested in another).
    &mut sqlx::Transaction<'_, Postgres>
);

impl BusinessRows for &mut PgConnection {
    type Row = PgRow;

    async fn lookup<'a>(
        &'a mut self,
        lookup: &'static str,
        key: &'a str,
    ) -> StoreResult<Vec<PgRow>> {
        Ok(sqlx::query(lookup).bind(key).fetch_all(&mut **self).await?)
    }

    fn fingerprint(row: &PgRow, column: &str) -> StoreResult<Vec<u8>> {
        Ok(row.try_get(column)?)
    }
}

/// The depth of the transaction a connection is in: 1 for the outermost, more for a savepoint.
fn depth(conn: &PgConnection) -> usize {
    <Postgres as sqlx::Database>::TransactionManager::get_transaction_depth(conn)
}

/// `Claim::commit` on sqlx: a nested transaction is refused before anything is sent (sqlx knows
/// its depth), then the statement and the COMMIT go one after the other: two round trips. A
/// statement that fails (a savepoint opened with plain SQL, TXK03, included) is followed by a
/// ROLLBACK, not a COMMIT: nothing is committed, and the connection is left clean.
impl Committing for sqlx::Transaction<'_, Postgres> {
    fn statements(&mut self) -> impl Statements + '_ {
        self
    }

    fn complete_key_and_commit<'a>(
        mut self,
        complete: &'a CompleteKey<'a>,
    ) -> BoxFuture<'a, (StoreResult<Option<Inserted>>, StoreResult<()>)>
    where
        Self: 'a,
    {
        Box::pin(async move {
            if depth(&self) != 1 {
                // Dropped: sqlx rolls back this savepoint alone, as for any transaction dropped.
                return (Err(StoreError::Refused(Refused::Nested)), Ok(()));
            }
            match complete_key(&mut self, complete).await {
                Ok(written) => (Ok(written), self.commit().await.map_err(Into::into)),
                Err(e) => {
                    // The statement's error is the answer; a failed ROLLBACK (a lost connection)
                    // leaves nothing committed either.
                    let _ = self.rollback().await;
                    (Err(e), Ok(()))
                }
            }
        })
    }

    async fn commit_tx(self) -> StoreResult<()> {
        Ok(sqlx::Transaction::commit(self).await?)
    }

    async fn rollback_tx(self) -> StoreResult<()> {
        Ok(sqlx::Transaction::rollback(self).await?)
    }
}
