-- Takes the key's transaction-scoped advisory lock if no request holds it: the common case,
-- without touching any setting. Every request of a key (scope $1, key $2) takes this lock (or
-- waits for it, `idempotency_keys/lock_wait.sql`) before anything else, so concurrent requests with one key run one
-- after the other, and the lookup behind the lock sees what the previous holder committed (under
-- READ COMMITTED each statement takes a new snapshot). Returns whether it got the lock, the
-- isolation level, the transaction's time (the claim's time, and the key row's `created_at` when
-- it is written at the end) and the backend's pid (with the time, it tells the transaction the
-- key is later stored in).
--
-- Parameters:
-- $1 scope: text
-- $2 key: text
SELECT pg_try_advisory_xact_lock(hashtextextended($1 || chr(10) || $2,
4411)), current_setting('transaction_isolation'), now(), pg_backend_pid()
