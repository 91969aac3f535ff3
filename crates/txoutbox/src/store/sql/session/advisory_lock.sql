-- Waits for and takes the session-scoped advisory lock $1: migrations run under it (on
-- tokio-postgres and on sqlx alike), so two processes starting at once apply each migration once.
-- Session-scoped, not transaction-scoped: refinery runs each migration in its own transaction.
--
-- Parameters:
-- $1 key: int8
SELECT pg_advisory_lock($1)
