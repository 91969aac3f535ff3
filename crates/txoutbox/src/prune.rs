//! Pruning of expired idempotency keys, in bounded batches that each commit on their own, so no
//! long lock is held and a request holding a key is skipped, not waited for.

use tokio_postgres::Client;

use crate::store::{keys, Unnamed};
use crate::Result;

/// The default number of keys deleted per batch.
pub const DEFAULT_PRUNE_BATCH: i64 = 1_000;

/// Deletes expired keys, `batch` at a time, until none is left. Returns how many were deleted.
/// After a key is pruned, a request with it is new again: the key window is the retry contract.
pub async fn prune_expired_keys(client: &Client, batch: i64) -> Result<u64> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = keys::prune_expired(&Unnamed(client), batch).await?;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
    }
}
