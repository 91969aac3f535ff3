-- Ends the park of the rows $1 a claim has just parked (the first it parked of each ordering key:
-- every later one has that row ahead) whose ordering key has no earlier row left (the head's
-- completion committed after the claim's snapshot was taken, so the claim still saw it; its
-- unpark of the next row came before the claim's park). Runs in a snapshot taken after
-- the claim committed, so it sees every completion the claim could have missed; a completion
-- that commits later unparks the next row itself. Skips rows another transaction holds: a
-- completion unparking them, or another claim, which rechecks them in turn (and waiting could
-- deadlock with a completion that holds the head). Unparking a row that should wait is
-- harmless: every claim checks the head again. The row ahead is looked up by a scalar subquery
-- with LIMIT 1, an index lookup per parked row: as an anti-join the planner hashed the whole hot
-- table.
--
-- Parameters:
-- $1 parked: uuid[]
WITH freed AS (
    SELECT m.id FROM txoutbox_messages m
    WHERE m.id = ANY($1::uuid[]) AND m.status = 'pending' AND (
        SELECT p.seq FROM txoutbox_messages p
        WHERE p.ordering_key = m.ordering_key AND p.seq < m.seq ORDER BY p.seq LIMIT 1) IS NULL
    FOR UPDATE SKIP LOCKED)
UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now())
FROM freed f WHERE m.id = f.id RETURNING m.id
