-- Deletes one batch ($2) of rows discarded before $1, oldest first, with their attempt-log rows.
--
-- Parameters:
-- $1 cutoff: timestamptz
-- $2 batch: int8
WITH doomed AS (
    SELECT id FROM txoutbox_discarded WHERE discarded_at < $1
    ORDER BY discarded_at LIMIT $2 FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM txoutbox_discarded d USING doomed WHERE d.id = doomed.id RETURNING d.id),
logs AS (
    DELETE FROM txoutbox_attempt_log a USING gone WHERE a.message_id = gone.id RETURNING 1)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM logs)
