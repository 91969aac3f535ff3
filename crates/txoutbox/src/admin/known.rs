//! The typo check of pause and resume: a destination no row, flow-control state or configured
//! sink has ever named is refused with the names that exist, closest first, so `pause emial`
//! does not pause nothing while `email` keeps flowing.

use tokio_postgres::GenericClient;

use super::AdminError;
use crate::store::admin::known as store;

/// How many names each large table offers to an [`AdminError::UnknownDestination`] at most.
const KNOWN_PER_TABLE: i64 = 1000;

/// Refuses `destination` ([`AdminError::UnknownDestination`]) unless a row of the outbox (hot,
/// delivered or discarded), a flow-control state or one of `configured` (the sinks of the
/// caller's relay, when it knows them) names it. Call it before
/// [`pause_destination`](super::pause_destination) or
/// [`resume_destination`](super::resume_destination) with what an operator typed; skip it to
/// pause a destination about to be used (`--force`).
pub async fn require_known_destination(
    client: &impl GenericClient,
    destination: &str,
    configured: &[String],
) -> Result<(), AdminError> {
    if configured.iter().any(|c| c == destination) || store::named(client, destination).await? {
        return Ok(());
    }
    let mut known = store::known(client, KNOWN_PER_TABLE).await?;
    known.extend(configured.iter().cloned());
    Err(AdminError::UnknownDestination {
        destination: destination.to_owned(),
        known: closest_first(destination, known),
    })
}

/// `names` without repeats, those `typed` may have meant first: the ones its `*` pattern
/// matches, by name (a pause names one destination; a pattern is refused with its matches),
/// then the others by edit distance (a swapped pair of letters counts one), then by name.
pub(super) fn closest_first(typed: &str, mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names.dedup();
    let pattern = typed.contains('*');
    names.sort_by_cached_key(|name| {
        if pattern && destination_matches(typed, name) {
            (false, 0)
        } else {
            (true, strsim::damerau_levenshtein(typed, name))
        }
    });
    names
}

/// Whether destination `name` matches `pattern`, where `*` stands for any text (none
/// included): `webhook:*` matches `webhook:orders` and `webhook:`, `email` only `email`. The
/// relay command's per-destination flags and this typo check read patterns so.
///
/// ```
/// use txoutbox::admin::destination_matches;
/// assert!(destination_matches("webhook:*", "webhook:orders"));
/// assert!(destination_matches("*:eu-*", "stripe:eu-west"));
/// assert!(!destination_matches("email", "emails"));
/// ```
pub fn destination_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(mut rest) = parts.next().and_then(|first| name.strip_prefix(first)) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}
