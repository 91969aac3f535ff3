-- How long ago the oldest pending row was enqueued, exactly: the first pending entry of the
-- `(created_at, seq)` index.
--
-- Parameters: none.
SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float8
FROM txoutbox_messages WHERE status = 'pending'
