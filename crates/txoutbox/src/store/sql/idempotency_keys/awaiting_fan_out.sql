-- The oldest keys (up to $1) that still carry effects, but keys $2 (as in `idempotency_keys/fan_out.sql`).
--
-- Parameters:
-- $1 limit: int8
-- $2 skip: text[]
SELECT scope, key FROM txoutbox_idempotency_keys
WHERE effects IS NOT NULL AND NOT (scope || chr(10) || key = ANY($2::text[]))
ORDER BY created_at LIMIT $1
