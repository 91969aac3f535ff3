-- The key row's insert, completed with the response, in `complete_insert*.sql` and
-- `complete_take_over*.sql` (which add an ON CONFLICT clause, `parts/take_over_key.sql`).
INSERT INTO txoutbox_idempotency_keys AS k (scope, key, fingerprint, state,
    response_status, response_headers, response_body, created_at, expires_at, effects)
VALUES ($1, $2, $3, 'completed', $4, $5, $6, now(), now() + make_interval(secs => $7), $8)
