-- `idempotency_keys/lock_try.sql` when another request holds the lock: waits for it at most $3 (a
-- `lock_timeout`); `idempotency_keys/lookup_restore.sql`, sent right behind it, restores the caller's timeout. The
-- `set_config` calls are nested into the lock's argument so that they run before the wait: the
-- caller's timeout is saved, ours set; if the wait times out the transaction is aborted and the
-- setting dies with it.
--
-- Parameters:
-- $1 scope: text
-- $2 key: text
-- $3 lock_timeout: text
SELECT pg_advisory_xact_lock(hashtextextended(CASE WHEN set_config(
'lock_timeout', CASE WHEN set_config('txoutbox.saved_lock_timeout',
    current_setting('lock_timeout'), true) IS NULL THEN $3 ELSE $3 END, true) IS NULL
THEN $1 ELSE $1 END || chr(10) || $2, 4411)) IS NULL,
current_setting('transaction_isolation'), now(), pg_backend_pid()
