-- The destinations rows and flow control name, at most $1 from each of the two large tables:
-- a skip scan of each's (destination, downstream_key) index, one probe per name, however many
-- rows each name has.
--
-- Parameters:
-- $1 per_table: int8
WITH RECURSIVE
hot (destination, n) AS (
    (SELECT destination, 1 FROM txoutbox_messages ORDER BY destination LIMIT 1)
    UNION ALL
    SELECT (SELECT m.destination FROM txoutbox_messages m
            WHERE m.destination > hot.destination ORDER BY m.destination LIMIT 1), n + 1
    FROM hot WHERE hot.destination IS NOT NULL AND n < $1),
delivered (destination, n) AS (
    (SELECT destination, 1 FROM txoutbox_delivered ORDER BY destination LIMIT 1)
    UNION ALL
    SELECT (SELECT d.destination FROM txoutbox_delivered d
            WHERE d.destination > delivered.destination ORDER BY d.destination LIMIT 1),
        n + 1
    FROM delivered WHERE delivered.destination IS NOT NULL AND n < $1)
SELECT destination FROM hot WHERE destination IS NOT NULL
UNION SELECT destination FROM delivered WHERE destination IS NOT NULL
UNION SELECT destination FROM txoutbox_discarded
UNION SELECT destination FROM txoutbox_destinations
