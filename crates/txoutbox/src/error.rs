//! The library's one error type. Each variant says what the caller should answer.

use crate::key::KeyError;
use crate::schema::SchemaMismatch;

/// What went wrong in a txoutbox call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Postgres could not be reached, or the connection dropped. Nothing was decided: answer
    /// `503 Service Unavailable` with `Retry-After`, never treat the key as new.
    #[error("the outbox store is unavailable: {message}")]
    StoreUnavailable {
        /// What failed, in one line (the hosts tried, the driver's words).
        message: String,
        /// The driver's or the pool's error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// The transaction lost a race with a concurrent one: a serialization failure (40001,
    /// REPEATABLE READ or SERIALIZABLE) or a deadlock (40P01). Nothing it wrote is kept: roll
    /// back and answer `409 Conflict` with `Retry-After`; the retry replays the winner's answer
    /// or runs again.
    #[error("the transaction conflicted with a concurrent one and must be retried: {message}")]
    Conflict {
        /// The server's message, or the library's when it detected the race itself.
        message: String,
        /// The driver's error, when the server answered with one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// Postgres answered with an error (a constraint, a missing migration, a bug).
    #[error("database error: {}", db_message(.0))]
    Database(#[source] tokio_postgres::Error),
    /// Postgres answered with an error through another driver than tokio-postgres (sqlx, the
    /// `sqlx` feature), or that driver could not decode a row: the text is the server's message
    /// and SQLSTATE, as for [`Error::Database`].
    #[error("database error: {message}")]
    Driver {
        /// The server's message and SQLSTATE (or the driver's own words), with what to run when
        /// one of txoutbox's tables or columns is missing.
        message: String,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The idempotency key is malformed (400).
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A payload or header could not be serialised to JSON.
    #[error("the payload does not serialise to JSON: {0}")]
    Payload(#[from] serde_json::Error),
    /// A payload its destination's builder or check refuses (an email without a recipient, a
    /// webhook URL that is not http(s), a Stripe amount below 1, raw JSON of the wrong shape),
    /// caught before the row is written rather than dead-lettered by the relay later. The source
    /// is the builder's own typed error (`txoutbox_email::EmailError`, ...), reachable with
    /// `std::error::Error::source` and `downcast_ref`. Answer `422 Unprocessable Content`.
    #[error("invalid payload: {0}")]
    InvalidPayload(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// Caller input the library refuses to write: a message, scope, effect name, traceparent or
    /// response (the text says why). A client's mistake or the service's: answer 400.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A state the library's own invariants rule out (a claimed key missing from its own
    /// transaction, a query that must return a row returned none): a bug or a misuse such as
    /// completing a claim on another connection. Answer 500.
    #[error("internal error: {0}")]
    Internal(String),
    /// A stored row this build cannot decode (JSON Postgres accepts and serde_json refuses, or
    /// not the shape txoutbox writes: written by another program or by hand); the text names the
    /// row, the column and the cause. It fails the request that read the row, and no other.
    /// Answer 500.
    #[error("a stored row cannot be decoded: {message}")]
    Undecodable {
        /// The row, the column and the cause.
        message: String,
        /// The decoder's error (tokio-postgres's, serde_json's).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// A configuration that cannot work, refused at start (the text names the setting).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Applying the migrations failed.
    #[error("migration failed: {message}")]
    Migration {
        /// What failed.
        message: String,
        /// The migration runner's error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// The database's schema is not the version this build needs (never migrated, behind, or
    /// migrated by a newer txoutbox); the text is one line that says what to run. Nothing can
    /// work until it matches: answer `503 Service Unavailable`.
    #[error(transparent)]
    Schema(#[from] SchemaMismatch),
}

impl Error {
    /// True when the store could not be reached: retry later (503), do not assume anything.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::StoreUnavailable { .. })
    }

    /// An [`Error::InvalidPayload`] whose source is `err`: what a sink crate's payload error
    /// converts into.
    pub fn invalid_payload(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::InvalidPayload(Box::new(err))
    }

    /// An [`Error::Conflict`] the library detected itself (no driver error behind it).
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Error::Conflict {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Undecodable`] for a stored document `source` refused.
    pub(crate) fn undecodable(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Undecodable {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The HTTP status a service should answer this error with.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::StoreUnavailable { .. } | Error::Schema(_) => 503,
            Error::Key(_) | Error::Invalid(_) | Error::Payload(_) => 400,
            Error::Conflict { .. } => 409,
            Error::InvalidPayload(_) => 422,
            Error::Database(_)
            | Error::Driver { .. }
            | Error::Migration { .. }
            | Error::Config(_)
            | Error::Internal(_)
            | Error::Undecodable { .. } => 500,
        }
    }
}

/// Errors without a server answer (I/O, closed connection, timeouts), connection exceptions
/// (SQLSTATE class 08) and a server shutting down or starting (57P01..57P03) mean the store is
/// unreachable; a serialization failure (40001) or a deadlock (40P01) is a [`Error::Conflict`];
/// any other server answer is a database error. A column the driver cannot decode is
/// [`Error::Undecodable`], and the driver's other client-side refusals (a parameter it cannot
/// encode, a missing column, a wrong count) are database errors: none of them is an outage.
impl From<tokio_postgres::Error> for Error {
    fn from(err: tokio_postgres::Error) -> Self {
        if let Some(db) = err.as_db_error() {
            if matches!(db.code().code(), "40001" | "40P01") {
                return Error::Conflict {
                    message: db.message().to_owned(),
                    source: Some(Box::new(err)),
                };
            }
        }
        match client_side(&err) {
            Some(ClientSide::Decode) => {
                return Error::Undecodable {
                    message: crate::pg::describe(&err),
                    source: Some(Box::new(err)),
                }
            }
            Some(ClientSide::Other) => return Error::Database(err),
            None => {}
        }
        let unavailable = err.is_closed()
            || match err.as_db_error() {
                None => true,
                Some(db) => {
                    let code = db.code().code();
                    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
                }
            };
        if unavailable {
            let message = match err.as_db_error() {
                Some(db) => db.message().to_owned(),
                None => crate::pg::describe(&err),
            };
            Error::StoreUnavailable {
                message,
                source: Some(Box::new(err)),
            }
        } else {
            Error::Database(err)
        }
    }
}

/// A refusal of the driver's own, about a statement's data or shape rather than the connection.
enum ClientSide {
    /// A column's value cannot be decoded into its Rust type.
    Decode,
    /// A parameter that cannot be encoded, a missing column, a wrong count of parameters,
    /// columns or rows.
    Other,
}

/// What kind of client-side refusal `err` is, if it is one. tokio-postgres tells its error's
/// kind only in its text (the kind's own, without the cause).
fn client_side(err: &tokio_postgres::Error) -> Option<ClientSide> {
    if err.as_db_error().is_some() || err.is_closed() {
        return None;
    }
    let text = err.to_string();
    if text.starts_with("error deserializing column") {
        return Some(ClientSide::Decode);
    }
    let other = text.starts_with("error serializing parameter")
        || text.starts_with("invalid column")
        || text.starts_with("query returned an unexpected number of")
        || (text.starts_with("expected ") && text.contains(" parameters but got "));
    other.then_some(ClientSide::Other)
}

/// As for tokio-postgres: no server answer, a connection exception or a server shutting down is
/// [`Error::StoreUnavailable`]; 40001 and 40P01 are [`Error::Conflict`]; any other server answer
/// (or a row sqlx cannot decode) is [`Error::Driver`].
#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        crate::store::sqlx_driver::error(err)
    }
}

impl From<deadpool_postgres::PoolError> for Error {
    fn from(err: deadpool_postgres::PoolError) -> Self {
        match err {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            other => Error::StoreUnavailable {
                message: other.to_string(),
                source: Some(Box::new(other)),
            },
        }
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The server's own message (tokio-postgres's Display only says "db error"), with what to do
/// when it is one of txoutbox's tables or columns that is missing: the schema is not the one
/// this build needs (the binaries check it at start; a library caller may not have).
fn db_message(err: &tokio_postgres::Error) -> String {
    let Some(db) = err.as_db_error() else {
        return err.to_string();
    };
    server_message(db.code().code(), db.message())
}

/// A server's error message with its SQLSTATE, and what to run when the relation or column it
/// misses is one of txoutbox's.
pub(crate) fn server_message(code: &str, message: &str) -> String {
    let ours_missing = matches!(code, "42P01" | "42703") && message.contains(TABLE_PREFIX);
    let hint = if ours_missing {
        ": the database schema does not match this txoutbox: run `txoutbox migrate`"
    } else {
        ""
    };
    format!("{message} ({code}){hint}")
}

/// The prefix of every relation txoutbox's migrations create.
const TABLE_PREFIX: &str = "\"txoutbox_";

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("an email needs at least one To recipient")]
    struct NoRecipient;

    #[test]
    fn an_invalid_payload_is_a_422_that_keeps_the_builders_error_as_its_source() {
        let err = Error::invalid_payload(NoRecipient);
        assert_eq!(err.http_status(), 422);
        assert_eq!(
            err.to_string(),
            "invalid payload: an email needs at least one To recipient"
        );
        let source = std::error::Error::source(&err).expect("a source");
        assert!(source.downcast_ref::<NoRecipient>().is_some(), "{source:?}");
    }

    #[test]
    fn a_closed_pool_is_unavailable_and_keeps_the_pools_error_as_its_source() {
        let err = Error::from(deadpool_postgres::PoolError::Closed);
        assert!(err.is_unavailable(), "{err:?}");
        let source = std::error::Error::source(&err).expect("a source");
        assert!(
            matches!(
                source.downcast_ref::<deadpool_postgres::PoolError>(),
                Some(deadpool_postgres::PoolError::Closed)
            ),
            "{source:?}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_unavailable_and_keeps_the_drivers_error_as_its_source() {
        // Port 1 on the loopback: nothing listens there, the connection is refused at once.
        let refused = tokio_postgres::connect(
            "host=127.0.0.1 port=1 user=nobody connect_timeout=5",
            tokio_postgres::NoTls,
        )
        .await
        .err()
        .expect("nothing listens on port 1");
        let err = Error::from(refused);
        assert!(err.is_unavailable(), "{err:?}");
        let source = std::error::Error::source(&err).expect("a source");
        let driver = source.downcast_ref::<tokio_postgres::Error>();
        assert!(
            driver.is_some_and(|e| e.as_db_error().is_none()),
            "{source:?}"
        );
    }
}
