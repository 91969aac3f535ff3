-- The rows a large backlog still counts exactly, through their small partial indexes: in flight
-- (`txoutbox_messages_lease`), failed and unknown (`txoutbox_messages_dead`).
--
-- Parameters: none.
SELECT destination, status, count(*), NULL::float8
FROM txoutbox_messages WHERE status = 'in_flight' GROUP BY destination, status
UNION ALL
SELECT destination, status, count(*), NULL::float8
FROM txoutbox_messages WHERE status IN ('failed', 'unknown') GROUP BY destination, status
