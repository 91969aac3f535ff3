-- The backlog gauges: pending rows, and how long the longest-waiting due row has been due. Both
-- read only the partial index `txoutbox_messages_due` (the literal `'pending'` selects it): a
-- count over it, and its first entry.
--
-- Parameters: none.
SELECT
(SELECT count(*) FROM txoutbox_messages WHERE status = 'pending'),
COALESCE((SELECT EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8
    FROM txoutbox_messages WHERE status = 'pending' AND next_attempt_at <= now()), 0)::float8
