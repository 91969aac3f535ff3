-- Deletes one bounded batch ($1) of expired records, oldest first; skips records a delivery
-- holds right now.
--
-- Parameters:
-- $1 batch: int8
DELETE FROM txoutbox_inbox WHERE (consumer, message_id) IN (
SELECT consumer, message_id FROM txoutbox_inbox WHERE expires_at <= now()
ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING 1
