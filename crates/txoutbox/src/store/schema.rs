//! The schema's own statements: the session advisory lock migrations run under, and the version
//! refinery's history says the schema is at.

use super::statements::schema_history::VERSION;
use super::statements::session::{ADVISORY_LOCK as LOCK, ADVISORY_UNLOCK as UNLOCK};

use super::{Result, Run, TxExecutor};

/// SQLSTATE `undefined_table`.
const UNDEFINED_TABLE: &str = "42P01";

/// Waits for and takes the session lock `key`.
pub(crate) async fn lock(conn: &impl TxExecutor, key: i64) -> Result<()> {
    conn.run(LOCK, &[&key]).await?;
    Ok(())
}

/// Releases the session lock `key`.
pub(crate) async fn unlock(conn: &impl TxExecutor, key: i64) -> Result<()> {
    conn.run(UNLOCK, &[&key]).await?;
    Ok(())
}

/// The highest migration version applied; 0 when there is no history table (never migrated).
/// Run it outside a transaction: a missing table aborts the transaction it runs in.
pub(crate) async fn version(conn: &impl TxExecutor) -> Result<i32> {
    match conn.run(VERSION, &[]).await {
        Ok(rows) => match rows.first() {
            Some(row) => row.try_get(0),
            None => Ok(0),
        },
        Err(e) if e.code().map(|c| c.code()) == Some(UNDEFINED_TABLE) => Ok(0),
        Err(e) => Err(e),
    }
}
