-- Releases the session-scoped advisory lock $1 that `session/advisory_lock.sql` took, whatever
-- the migrations under it did.
--
-- Parameters:
-- $1 key: int8
SELECT pg_advisory_unlock($1)
