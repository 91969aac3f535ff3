//! Pruning of expired idempotency keys, in bounded batches that each commit on their own, so no
//! long lock is held and a request holding a key is skipped, not waited for.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::{sql, Result};

/// The default number of keys deleted per batch.
pub const DEFAULT_PRUNE_BATCH: i64 = 1_000;

/// Deletes expired keys, `batch` at a time, until none is left. Returns how many were deleted.
/// After a key is pruned, a request with it is new again: the key window is the retry contract.
pub async fn prune_expired_keys(client: &Client, batch: i64) -> Result<u64> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = client
            .query_typed(sql::keys::PRUNE_EXPIRED, &[(&batch, Type::INT8)])
            .await?
            .len() as u64;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
    }
}
