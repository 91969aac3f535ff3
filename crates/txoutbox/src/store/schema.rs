//! The schema's own statements: the session advisory lock migrations run under, and the version
//! refinery's history says the schema is at.

use tokio_postgres::types::Type;

use super::{Result, TxExecutor};

pub(crate) const LOCK: &str = "SELECT pg_advisory_lock($1)";
pub(crate) const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

/// The highest migration applied (0 for an empty history). Cast: refinery's `version` column is
/// `int4`, or `int8` when built with its `int8-versions` feature. The table is found through the
/// search path, as refinery finds it when it migrates.
pub(crate) const VERSION: &str =
    "SELECT COALESCE(max(version), 0)::int4 FROM txoutbox_schema_history";

/// SQLSTATE `undefined_table`.
const UNDEFINED_TABLE: &str = "42P01";

/// Waits for and takes the session lock `key`.
pub(crate) async fn lock(conn: &impl TxExecutor, key: i64) -> Result<()> {
    conn.rows(LOCK, &[(&key, Type::INT8)]).await?;
    Ok(())
}

/// Releases the session lock `key`.
pub(crate) async fn unlock(conn: &impl TxExecutor, key: i64) -> Result<()> {
    conn.rows(UNLOCK, &[(&key, Type::INT8)]).await?;
    Ok(())
}

/// The highest migration version applied; 0 when there is no history table (never migrated).
/// Run it outside a transaction: a missing table aborts the transaction it runs in.
pub(crate) async fn version(conn: &impl TxExecutor) -> Result<i32> {
    match conn.rows(VERSION, &[]).await {
        Ok(rows) => match rows.first() {
            Some(row) => row.try_get(0),
            None => Ok(0),
        },
        Err(e) if e.code().map(|c| c.code()) == Some(UNDEFINED_TABLE) => Ok(0),
        Err(e) => Err(e),
    }
}
