//! Whether the database's schema is the one this build needs: the highest migration applied (by
//! refinery's history) against the highest migration this build carries. The binaries check it
//! at start, the relay's readiness on every probe, so a database that `txoutbox migrate` never
//! ran on, or one a newer txoutbox migrated, is refused in one line that says what to run,
//! instead of failing statement by statement with "relation does not exist".

use std::sync::OnceLock;

use crate::error::Result;
use crate::store::{schema, Unnamed};

/// The schema version of a database and the one this build of txoutbox needs.
///
/// Versions are the numbers of the files in `migrations/` (`V5__…` is 5); a database with no
/// history table (never migrated) is at version 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaVersion {
    /// The highest migration applied to the database (0: never migrated).
    pub current: i32,
    /// The highest migration this build carries: the version it reads and writes.
    pub required: i32,
}

impl SchemaVersion {
    /// The version this build needs, with `current` as the database's.
    pub(crate) fn with_current(current: i32) -> Self {
        Self {
            current,
            required: required_version(),
        }
    }

    /// `Ok` when the database is at the version this build needs; else why it cannot be used.
    pub fn check(self) -> Result<Self, SchemaMismatch> {
        let SchemaVersion { current, required } = self;
        match current.cmp(&required) {
            std::cmp::Ordering::Equal => Ok(self),
            std::cmp::Ordering::Less => Err(SchemaMismatch::Behind { current, required }),
            std::cmp::Ordering::Greater => Err(SchemaMismatch::Ahead { current, required }),
        }
    }
}

/// A database schema this build cannot use. Its text is the one line an operator needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaMismatch {
    /// The database lacks migrations this build needs (version 0: never migrated): run
    /// `txoutbox migrate` (or [`migrate`](crate::migrate)).
    #[error(
        "the database schema is at version {current}, this txoutbox needs {required}: \
         run `txoutbox migrate`"
    )]
    Behind {
        /// The database's version.
        current: i32,
        /// This build's.
        required: i32,
    },
    /// A newer txoutbox migrated the database past what this build knows: run that txoutbox
    /// (a schema is never migrated down).
    #[error(
        "the database schema is at version {current}, this txoutbox knows only up to \
         {required}: upgrade txoutbox (a schema is never migrated down)"
    )]
    Ahead {
        /// The database's version.
        current: i32,
        /// This build's.
        required: i32,
    },
}

/// The highest migration this build carries.
pub(crate) fn required_version() -> i32 {
    static REQUIRED: OnceLock<i32> = OnceLock::new();
    *REQUIRED.get_or_init(|| {
        crate::migrate::embedded_migrations()
            .iter()
            .map(|(version, _, _)| *version)
            .max()
            .unwrap_or(0)
    })
}

/// Reads the schema version of the database `client` is connected to (one small query; run it
/// outside a transaction) and fails with [`Error::Schema`](crate::Error::Schema) unless it is
/// the one this build needs. A deadpool connection derefs to the client: `check_schema(&conn)`.
///
/// Call it at start and in readiness probes, never on a request's path: the write path and the
/// relay's statements assume the schema.
///
/// ```
/// # async fn start(client: &tokio_postgres::Client) -> Result<(), txoutbox::Error> {
/// match txoutbox::check_schema(client).await {
///     Ok(_) => {}
///     Err(txoutbox::Error::Schema(mismatch)) => eprintln!("{mismatch}"), // says what to run
///     Err(other) => return Err(other),                                    // unreachable, …
/// }
/// # Ok(())
/// # }
/// # txoutbox_test_support::doc_test(|client| async move { Ok(start(&client).await?) });
/// ```
pub async fn check_schema(client: &tokio_postgres::Client) -> Result<SchemaVersion> {
    Ok(schema_version(client).await?.check()?)
}

/// The schema version of the database `client` is connected to, whether it matches or not.
pub(crate) async fn schema_version(client: &tokio_postgres::Client) -> Result<SchemaVersion> {
    let current = schema::version(&Unnamed(client)).await?;
    Ok(SchemaVersion::with_current(current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_required_version_is_the_highest_embedded_migration() {
        let highest = crate::migrate::embedded_migrations()
            .last()
            .map(|(version, _, _)| *version);
        assert_eq!(Some(required_version()), highest);
        assert!(required_version() > 0);
    }

    #[test]
    fn a_schema_behind_says_to_migrate_and_one_ahead_to_upgrade() {
        let behind = SchemaVersion {
            current: 4,
            required: 5,
        };
        assert_eq!(
            behind.check().map_err(|e| e.to_string()),
            Err(
                "the database schema is at version 4, this txoutbox needs 5: \
                 run `txoutbox migrate`"
                    .to_owned()
            )
        );
        let ahead = SchemaVersion {
            current: 6,
            required: 5,
        };
        assert_eq!(
            ahead.check(),
            Err(SchemaMismatch::Ahead {
                current: 6,
                required: 5
            })
        );
        let same = SchemaVersion {
            current: 5,
            required: 5,
        };
        assert_eq!(same.check(), Ok(same));
    }

    #[test]
    fn the_history_statement_reads_refinerys_table() {
        assert!(crate::store::statements::schema_history::VERSION
            .sql
            .contains(crate::migrate::HISTORY_TABLE));
    }
}
