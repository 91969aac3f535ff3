//! The database's side of a run: the audit triggers installed first (so `txoutbox purge` hides
//! nothing from the checker), the backlog's size while it settles, and what the tables hold at
//! the end, by row.

use std::collections::HashMap;

use anyhow::Result;

use super::check::{Attempt, DeliveredRow, Final, HotRow};

/// Copies of every attempt (the log's rows and the delivering attempts delivered rows carry) and of
/// the delivered history, which `txoutbox purge` does not touch.
pub(super) const AUDIT: &str = "\
CREATE TABLE soak_attempts (LIKE txoutbox_attempts);
CREATE TABLE soak_delivered (id uuid NOT NULL, downstream_key text NOT NULL, row bigint);
CREATE FUNCTION soak_copy_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO soak_attempts VALUES (NEW.*); RETURN NULL; END $$;
CREATE FUNCTION soak_copy_delivered() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO soak_delivered VALUES (NEW.id, NEW.downstream_key, CASE WHEN
        jsonb_typeof(NEW.payload -> 'data' -> 'row') = 'number'
        THEN (NEW.payload -> 'data' ->> 'row')::bigint END);
    IF NEW.relay IS NOT NULL THEN
        INSERT INTO soak_attempts VALUES (NEW.id, NEW.attempts, NEW.downstream_key, NEW.relay,
            NEW.lease_token, 'delivered', NULL, NEW.receipt, NEW.attempt_started_at,
            NEW.delivered_at, NEW.destination);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER soak_copy_attempt AFTER INSERT ON txoutbox_attempt_log
    FOR EACH ROW EXECUTE FUNCTION soak_copy_attempt();
CREATE TRIGGER soak_copy_delivered AFTER INSERT ON txoutbox_delivered
    FOR EACH ROW EXECUTE FUNCTION soak_copy_delivered();";

/// Rows that still have somewhere to go: in flight, or pending and not behind a dead-lettered
/// (or unknown) earlier row of their ordering key; and key rows still carrying effects.
pub(super) const UNSETTLED: &str = "SELECT (SELECT count(*) FROM txoutbox_messages m \
     WHERE m.status = 'in_flight' OR (m.status = 'pending' AND NOT EXISTS ( \
         SELECT 1 FROM txoutbox_messages p WHERE p.ordering_key = m.ordering_key \
         AND p.seq < m.seq AND p.status IN ('failed', 'unknown')))) \
     + (SELECT count(*) FROM txoutbox_idempotency_keys WHERE effects IS NOT NULL)";

/// The row a stored payload names (`data.row`), read by Postgres (which reads any payload it
/// stored, one the relay cannot decode too).
pub(super) const ROW_OF_PAYLOAD: &str =
    "CASE WHEN jsonb_typeof(payload -> 'data' -> 'row') = 'number' \
     THEN (payload -> 'data' ->> 'row')::bigint END";

/// The plan row a stored message is (column `col`, `None` for no soak row), its id (column 0)
/// recorded as one of that row's copies.
fn copy_of(state: &mut Final, r: &tokio_postgres::Row, col: usize) -> Option<(usize, uuid::Uuid)> {
    let row = r
        .get::<_, Option<i64>>(col)
        .and_then(|r| usize::try_from(r).ok())?;
    let id: uuid::Uuid = r.get(0);
    state.copies.entry(row).or_default().insert(id);
    Some((row, id))
}

pub(super) async fn read_final(client: &tokio_postgres::Client) -> Result<Final> {
    let mut state = Final::default();
    let hot = format!(
        "SELECT id, downstream_key, status, last_error, lease_owner, attempts, \
         EXTRACT(EPOCH FROM next_attempt_at - now())::float8, {ROW_OF_PAYLOAD} \
         FROM txoutbox_messages"
    );
    for r in client.query(&hot, &[]).await? {
        let Some((row, id)) = copy_of(&mut state, &r, 7) else {
            continue;
        };
        state.hot.insert(
            row,
            HotRow {
                id,
                downstream_key: r.get(1),
                status: r.get(2),
                last_error: r.get(3),
                lease_owner: r.get(4),
                attempts: r.get(5),
                due_in: r.get(6),
            },
        );
    }
    let delivered = format!(
        "SELECT id, downstream_key, row FROM soak_delivered UNION \
         SELECT id, downstream_key, {ROW_OF_PAYLOAD} FROM txoutbox_delivered"
    );
    for r in client.query(&delivered, &[]).await? {
        let Some((row, id)) = copy_of(&mut state, &r, 2) else {
            continue;
        };
        let downstream_key = r.get(1);
        state
            .delivered
            .insert(row, DeliveredRow { id, downstream_key });
    }
    let ids: HashMap<uuid::Uuid, usize> = state
        .copies
        .iter()
        .flat_map(|(row, ids)| ids.iter().map(move |id| (*id, *row)))
        .collect();
    for r in client
        .query(
            "SELECT message_id, relay, outcome FROM soak_attempts ORDER BY finished_at",
            &[],
        )
        .await?
    {
        let id: uuid::Uuid = r.get(0);
        if let Some(row) = ids.get(&id) {
            state.attempts.entry(*row).or_default().push(Attempt {
                relay: r.get(1),
                outcome: r.get(2),
            });
        }
    }
    Ok(state)
}
