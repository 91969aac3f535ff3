-- Hot rows by destination and status, with the age in seconds of each group's oldest row (used
-- for `pending`), counted exactly but reading at most $1 rows: when the counts add up to $1, the
-- backlog is larger and `messages/stats_sample.sql` answers instead. The delivered history is counted
-- by `delivered/stats_exact.sql` or `delivered/stats_estimate.sql`, never by a scan.
--
-- Parameters:
-- $1 bound: int8
SELECT destination, status, count(*),
    EXTRACT(EPOCH FROM now() - min(created_at))::float8
FROM (SELECT destination, status, created_at FROM txoutbox_messages LIMIT $1) h
GROUP BY destination, status
