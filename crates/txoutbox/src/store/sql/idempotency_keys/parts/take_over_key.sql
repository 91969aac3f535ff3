-- The ON CONFLICT clause of `complete_take_over*.sql`: the key row is written over the expired
-- key the lookup found, its effects kept (`parts/kept_effects.sql`); a live key is left alone.
ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
    state = 'completed', response_status = EXCLUDED.response_status,
    response_headers = EXCLUDED.response_headers, response_body = EXCLUDED.response_body,
    created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
\i idempotency_keys/parts/kept_effects.sql
WHERE k.expires_at <= now()
