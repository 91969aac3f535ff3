-- Inserts the key row at the claim, under REPEATABLE READ and SERIALIZABLE (where the lookup
-- reads the transaction's first snapshot and cannot see a key committed after it): a key
-- committed after the snapshot then refuses the insert with a serialization failure instead of
-- being overlooked. Takes over an expired key, leaving it the effects it still carries (the
-- completion, `update_key!`, adds this request's). Returns a row only when the key is now ours.
-- The lock timeout is set and restored as in `idempotency_keys/lock_wait.sql`, for a holder that took no advisory
-- lock.
--
-- Parameters:
-- $1 scope: text
-- $2 key: text
-- $3 fingerprint: bytea
-- $4 window_secs: float8
-- $5 lock_timeout: text
INSERT INTO txoutbox_idempotency_keys
(scope, key, fingerprint, state, expires_at, created_at)
VALUES ($1, $2, $3,
    CASE WHEN set_config('lock_timeout', CASE WHEN set_config(
        'txoutbox.saved_lock_timeout', current_setting('lock_timeout'), true)
        IS NULL THEN $5 ELSE $5 END, true) IS NULL THEN 'in_flight' ELSE 'in_flight' END,
    now() + make_interval(secs => $4), now())
ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
    state = 'in_flight', response_status = NULL, response_headers = NULL,
    response_body = NULL, created_at = now(), expires_at = EXCLUDED.expires_at
WHERE txoutbox_idempotency_keys.expires_at <= now()
RETURNING set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true)
