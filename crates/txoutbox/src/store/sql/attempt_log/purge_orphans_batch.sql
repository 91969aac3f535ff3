-- Deletes one batch ($2) of attempt-log rows older than $1 whose message is in no table
-- (purged before, or deleted by hand).
--
-- Parameters:
-- $1 cutoff: timestamptz
-- $2 batch: int8
DELETE FROM txoutbox_attempt_log WHERE ctid = ANY(ARRAY(
SELECT a.ctid FROM txoutbox_attempt_log a WHERE a.finished_at < $1
    AND NOT EXISTS (SELECT 1 FROM txoutbox_messages m WHERE m.id = a.message_id)
    AND NOT EXISTS (SELECT 1 FROM txoutbox_delivered d WHERE d.id = a.message_id)
    AND NOT EXISTS (SELECT 1 FROM txoutbox_discarded x WHERE x.id = a.message_id)
LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING 1
