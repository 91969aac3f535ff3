-- The end of `complete_*_with_messages.sql` and `complete_*_with_ordered_messages.sql`, opened
-- by `parts/messages.sql` or `parts/ordered_messages.sql`: `stored` ends, and the answer is the
-- ids and destinations of the outbox rows written (NULL when none was), then the checks.
RETURNING k.xmin = pg_current_xact_id()::xid AS outermost)
SELECT (SELECT array_agg(id) FROM messages), (SELECT array_agg(destination) FROM messages),
\i idempotency_keys/parts/checks.sql
