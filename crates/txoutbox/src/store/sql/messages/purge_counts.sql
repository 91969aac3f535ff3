-- What a purge would delete, with the cutoffs $1 (delivered), $2 (failed), $3 (unknown), $4
-- (discarded): the rows past their state's retention, their attempt-log rows, attempt-log rows
-- older than the delivered cutoff whose message is gone, expired keys. A failed or unknown row's
-- age is that of its last attempt-log entry (a replay starts it again), else its enqueue time.
--
-- Parameters:
-- $1 delivered: timestamptz
-- $2 failed: timestamptz
-- $3 unknown: timestamptz
-- $4 discarded: timestamptz
WITH hot AS (
    SELECT m.id, m.status FROM txoutbox_messages m
    WHERE (m.status = 'failed' AND m.created_at < $2 AND NOT EXISTS (
            SELECT 1 FROM txoutbox_attempt_log a WHERE a.message_id = m.id AND a.finished_at >= $2))
       OR (m.status = 'unknown' AND m.created_at < $3 AND NOT EXISTS (
            SELECT 1 FROM txoutbox_attempt_log a WHERE a.message_id = m.id AND a.finished_at >= $3))),
doomed AS (
    SELECT id FROM txoutbox_delivered WHERE delivered_at < $1
    UNION ALL SELECT id FROM hot
    UNION ALL SELECT id FROM txoutbox_discarded WHERE discarded_at < $4)
SELECT
    (SELECT count(*) FROM txoutbox_delivered WHERE delivered_at < $1),
    (SELECT count(*) FROM hot WHERE status = 'failed'),
    (SELECT count(*) FROM hot WHERE status = 'unknown'),
    (SELECT count(*) FROM txoutbox_discarded WHERE discarded_at < $4),
    (SELECT count(*) FROM txoutbox_attempts a WHERE a.message_id IN (SELECT id FROM doomed)),
    (SELECT count(*) FROM txoutbox_attempt_log a WHERE a.finished_at < $1
        AND NOT EXISTS (SELECT 1 FROM txoutbox_messages m WHERE m.id = a.message_id)
        AND NOT EXISTS (SELECT 1 FROM txoutbox_delivered d WHERE d.id = a.message_id)
        AND NOT EXISTS (SELECT 1 FROM txoutbox_discarded x WHERE x.id = a.message_id)),
    (SELECT count(*) FROM txoutbox_idempotency_keys WHERE expires_at <= now())
