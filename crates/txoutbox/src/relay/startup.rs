//! What the relay checks before its first claim: that the database's schema is the one this
//! build needs. A schema behind (never migrated) or ahead (a newer txoutbox migrated it) ends the
//! run with the one line that says what to run; an unreachable database is waited out, as the
//! claim loop waits out outages.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::Inner;
use crate::error::{Error, Result};

/// The longest pause between two tries while the database does not answer.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Waits until the database answers the schema check. `Ok(true)`: the schema matches, claim
/// away; `Ok(false)`: `shutdown` resolved first; [`Error::Schema`] on a mismatch, and any error
/// the database answers with (a role that may not read the history, …).
pub(super) async fn schema_matches<F: Future<Output = ()>>(
    inner: &Inner,
    mut shutdown: Pin<&mut F>,
) -> Result<bool> {
    let mut pause = Duration::from_millis(100);
    loop {
        let checked = async {
            let client = inner.pool.get().await?;
            crate::schema::check_schema(&client).await
        };
        let checked = tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ok(false),
            checked = checked => checked,
        };
        match checked {
            Ok(_) => return Ok(true),
            Err(e @ Error::StoreUnavailable { .. }) => {
                tracing::warn!(error = %e, "cannot check the database schema yet; retrying");
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ok(false),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
