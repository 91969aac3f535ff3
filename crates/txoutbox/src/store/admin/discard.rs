//! What a discard selects and writes (its rows are locked by [`super::replay::hot_rows`]).

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};
use uuid::Uuid;

use super::ids_by_status;
use crate::admin::{AdminError, FilterParams};
use crate::state::MessageStatus;

/// The ids a discard by filter selects: hot rows of the statuses $1 matching the filter, in
/// insertion order, at most $9 (NULL: all). Taken without locks: each batch locks and checks its
/// rows again.
const DISCARD_SELECT: &str = concat!(
    "SELECT t.id FROM txoutbox_messages t WHERE t.status = ANY($1::text[]) AND ",
    filter!(hot),
    " ORDER BY t.seq LIMIT $9"
);

/// Discards the hot rows $1 (locked and checked `failed` or `unknown` by the caller) with the
/// operator's reason $2: moves them to `txoutbox_discarded`, logs one operator action per row
/// (attempt 0, relay `operator`, outcome `discarded`, the text $3: the reason, and who gave it when
/// known), and ends the park
/// of the next pending row of each one's ordering key (the claim parks rows behind a head for
/// 30 s; the head is gone, so the next row is due at once). Returns the ids discarded.
const DISCARD: &str = "WITH gone AS ( \
     DELETE FROM txoutbox_messages m WHERE m.id = ANY($1::uuid[]) \
         AND m.status IN ('failed', 'unknown') \
     RETURNING m.id, m.seq, m.destination, m.payload, m.headers, m.downstream_key, \
         m.ordering_key, m.attempts, m.status, m.last_error, m.created_at), \
 kept AS ( \
     INSERT INTO txoutbox_discarded (id, seq, destination, payload, headers, downstream_key, \
         ordering_key, attempts, discarded_from, last_error, reason, created_at) \
     SELECT id, seq, destination, payload, headers, downstream_key, ordering_key, attempts, \
         status, last_error, $2, created_at FROM gone RETURNING id), \
 logged AS ( \
     INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, relay, \
         outcome, error, started_at, finished_at) \
     SELECT id, destination, 0, downstream_key, 'operator', 'discarded', $3, now(), now() \
     FROM gone), \
 unparked AS ( \
     UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now()) \
     FROM (SELECT DISTINCT ON (n.ordering_key) n.id FROM txoutbox_messages n \
             JOIN gone g ON n.ordering_key = g.ordering_key AND n.seq > g.seq \
             WHERE n.id <> ALL($1::uuid[]) \
             ORDER BY n.ordering_key, n.seq) nx \
     WHERE m.id = nx.id AND m.status = 'pending') \
 SELECT id FROM kept";

/// The ids a discard by filter selects among `statuses` ([`DISCARD_SELECT`]).
pub(crate) async fn select(
    client: &impl GenericClient,
    statuses: &[MessageStatus],
    filter: &FilterParams,
) -> Result<Vec<Uuid>, AdminError> {
    ids_by_status(client, DISCARD_SELECT, statuses, filter).await
}

/// Discards hot rows `ids` with `reason`, logging `note` ([`DISCARD`]).
pub(crate) async fn discard(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    reason: &str,
    note: &str,
) -> Result<(), AdminError> {
    tx.query_typed(
        DISCARD,
        &[
            (&ids, Type::UUID_ARRAY),
            (&reason, Type::TEXT),
            (&note, Type::TEXT),
        ],
    )
    .await?;
    Ok(())
}
