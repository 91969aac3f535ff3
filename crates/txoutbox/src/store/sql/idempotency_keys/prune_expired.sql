-- Deletes one bounded batch of expired keys; skips rows a request holds right now, and keys
-- whose effects are not fanned out yet (they would be lost).
--
-- Parameters:
-- $1 batch: int8
DELETE FROM txoutbox_idempotency_keys WHERE (scope, key) IN (
SELECT scope, key FROM txoutbox_idempotency_keys
WHERE expires_at <= now() AND effects IS NULL
ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING 1
