-- The record of message $2 of consumer $1 behind `inbox/record.sql` (which found one), restoring the
-- caller's lock timeout: always one row, its columns NULL when there is no record (it was
-- pruned meanwhile); `live` is false for an expired record.
--
-- Parameters:
-- $1 consumer: text
-- $2 message_id: text
SELECT i.received_at, i.outcome, i.expires_at > now() AS live,
set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true)
FROM (SELECT 1) AS one LEFT JOIN txoutbox_inbox i ON i.consumer = $1 AND i.message_id = $2
