-- Keys whose deferred effects the relay has not fanned out yet, counted through the partial
-- index `txoutbox_idempotency_keys_effects` but reading at most $1 of them, with how long ago
-- the oldest was stored.
--
-- Parameters:
-- $1 bound: int8
SELECT count(*),
    EXTRACT(EPOCH FROM now() - min(created_at))::float8
FROM (SELECT created_at FROM txoutbox_idempotency_keys WHERE effects IS NOT NULL
    ORDER BY created_at LIMIT $1) k
