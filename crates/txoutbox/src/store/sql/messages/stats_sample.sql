-- A backlog too large to count at each look: its pending rows from a sample of $1 percent of
-- the hot table's pages, scaled by 100 / $1, by destination, with the oldest row of each in the
-- sample. The same pages each time (a fixed seed): they stay cached, and a refreshed page does
-- not jump between two samples' figures.
--
-- Parameters:
-- $1 percent: float4
SELECT destination, status,
    round(count(*) * 100.0 / $1)::int8, EXTRACT(EPOCH FROM now() - min(created_at))::float8
FROM txoutbox_messages TABLESAMPLE SYSTEM ($1) REPEATABLE (0)
WHERE status = 'pending' GROUP BY destination, status
