-- One idempotency key ($1 scope, $2 key), with its claim time in microseconds since the epoch
-- (what its effects' downstream keys derive from) and whether its window has passed.
--
-- Parameters:
-- $1 scope: text
-- $2 key: text
SELECT scope, key, fingerprint, state, response_status,
    response_headers::text, response_body, created_at, expires_at,
    (extract(epoch FROM created_at) * 1000000)::int8, expires_at <= now()
FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2
