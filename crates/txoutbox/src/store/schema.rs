//! The schema's own statement: the session advisory lock migrations run under.

use tokio_postgres::types::Type;

use super::{Result, TxExecutor};

const LOCK: &str = "SELECT pg_advisory_lock($1)";
const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

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
