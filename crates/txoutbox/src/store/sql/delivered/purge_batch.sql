-- Deletes one batch ($2) of rows delivered before $1, oldest first, with their attempt-log rows,
-- in one statement (its own transaction). Rows a replay holds are skipped, not waited for. The
-- attempts counted are the log's rows and the delivering attempts the rows carry (V4).
--
-- Parameters:
-- $1 cutoff: timestamptz
-- $2 batch: int8
WITH doomed AS (
    SELECT id FROM txoutbox_delivered WHERE delivered_at < $1
    ORDER BY delivered_at LIMIT $2 FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM txoutbox_delivered d USING doomed WHERE d.id = doomed.id
    RETURNING d.id, d.relay IS NOT NULL AS carried),
logs AS (
    DELETE FROM txoutbox_attempt_log a USING gone WHERE a.message_id = gone.id RETURNING 1)
SELECT (SELECT count(*) FROM gone),
    (SELECT count(*) FROM logs) + (SELECT count(*) FROM gone WHERE carried)
