-- Failed rows grouped by destination and normalised error text: count, first and last failure
-- (the start of the row's last attempt, which the row keeps; its enqueue time when it has none),
-- one original text; the largest groups first, at most $1. Reads the failed rows only (the
-- partial index `txoutbox_messages_dead`), not the attempt log.
--
-- `class` is the failure's normalised text, `parts/error_class.sql` (its `\i` line), the same
-- as a filter on the error selects by (`parts/error_filter.sql`).
--
-- Parameters:
-- $1 limit: int8
SELECT status, destination, class, count(*), min(failed_at), max(failed_at),
    min(last_error)
FROM (
SELECT t.status, t.destination, t.last_error, COALESCE(left(
\i messages/parts/error_class.sql
            300), '') AS class, COALESCE(t.attempt_started_at, t.created_at) AS failed_at
FROM txoutbox_messages t WHERE t.status IN ('failed', 'unknown')) g
GROUP BY status, destination, class
ORDER BY status = 'unknown' DESC, count(*) DESC, destination, class LIMIT $1
