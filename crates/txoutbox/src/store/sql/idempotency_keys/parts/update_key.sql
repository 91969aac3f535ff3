-- The key row's update, completed with the response, in `complete_update*.sql`: the row
-- `claim.sql` inserted, its effects kept (`parts/kept_effects.sql`).
UPDATE txoutbox_idempotency_keys k SET state = 'completed', response_status = $4,
    response_headers = $5, response_body = $6,
\i idempotency_keys/parts/kept_effects.sql
WHERE k.scope = $1 AND k.key = $2
