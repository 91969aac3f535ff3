-- Reads the key (scope $1, key $2) behind `idempotency_keys/lock_try.sql`: no row when there is none; `live` is
-- false for an expired one (the request is new: the key is taken over when it is stored).
--
-- Parameters:
-- $1 scope: text
-- $2 key: text
SELECT fingerprint, state, response_status, response_headers::text,
response_body, expires_at > now() AS live
FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2
