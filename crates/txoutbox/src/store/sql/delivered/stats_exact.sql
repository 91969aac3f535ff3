-- Delivered rows by destination, counted exactly but reading at most $1 entries of the index
-- `txoutbox_delivered_key`: when the counts add up to $1, the history is larger and
-- `delivered/stats_estimate.sql` answers instead.
--
-- Parameters:
-- $1 bound: int8
SELECT destination, count(*) FROM (
SELECT destination FROM txoutbox_delivered ORDER BY destination, downstream_key LIMIT $1) d
GROUP BY destination
