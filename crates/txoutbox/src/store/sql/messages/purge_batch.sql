-- Deletes one batch ($3) of hot rows of status $1 (`failed` or `unknown`) whose last activity is
-- older than $2, with their attempt-log rows, and makes the next pending row of each one's
-- ordering key due (waiting or parked, the row ahead of it is gone: it is due at once; a row
-- whose enqueue commits after this statement's snapshot is found by the relay's sweep,
-- `messages/unpark_stranded.sql`). Rows a relay or an operator holds are skipped.
--
-- Parameters:
-- $1 status: text
-- $2 cutoff: timestamptz
-- $3 batch: int8
WITH doomed AS (
    SELECT m.id FROM txoutbox_messages m
    WHERE m.status = $1 AND m.created_at < $2 AND NOT EXISTS (
        SELECT 1 FROM txoutbox_attempt_log a WHERE a.message_id = m.id AND a.finished_at >= $2)
    ORDER BY m.seq LIMIT $3 FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM txoutbox_messages m USING doomed WHERE m.id = doomed.id AND m.status = $1
    RETURNING m.id, m.seq, m.ordering_key),
logs AS (
    DELETE FROM txoutbox_attempt_log a USING gone WHERE a.message_id = gone.id RETURNING 1),
unparked AS (
    UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now())
    FROM (SELECT DISTINCT ON (n.ordering_key) n.id FROM txoutbox_messages n
            JOIN gone g ON n.ordering_key = g.ordering_key AND n.seq > g.seq
            WHERE NOT EXISTS (SELECT 1 FROM doomed x WHERE x.id = n.id)
            ORDER BY n.ordering_key, n.seq) nx
    WHERE m.id = nx.id AND m.status = 'pending')
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM logs)
