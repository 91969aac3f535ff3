-- Discarded rows by destination (a small table: rows leave it only by the operator's hand).
--
-- Parameters: none.
SELECT destination, 'discarded', count(*), NULL::float8
FROM txoutbox_discarded GROUP BY destination
