-- `idempotency_keys/lookup.sql` behind `idempotency_keys/lock_wait.sql`, restoring the caller's lock timeout: always one row (the
-- key's columns NULL when there is none).
--
-- Parameters:
-- $1 scope: text
-- $2 key: text
SELECT k.fingerprint, k.state, k.response_status,
k.response_headers::text, k.response_body, COALESCE(k.expires_at > now(), false) AS live,
set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true)
FROM (SELECT 1) AS one LEFT JOIN txoutbox_idempotency_keys k ON k.scope = $1 AND k.key = $2
