-- Relay attempts that finished in the last $1 seconds, by destination: all of them, and those
-- that failed (`retry`, `failed`, `expired`, `unknown`). Operator actions, leases given back at
-- shutdown and outcomes that came after the lease was lost are not attempts with an outcome.
-- Attempts carry their destination (migration V3): the recent ones are read through the BRIN
-- index on `finished_at` alone. Attempts logged before V3 have none; theirs is looked up by
-- message id (a primary-key probe each, never a scan of the history).
--
-- Parameters:
-- $1 window: float8
SELECT destination, sum(n)::int8, sum(f)::int8 FROM (
    SELECT a.destination, count(*) AS n, count(*) FILTER (WHERE a.outcome <> 'delivered') AS f
    FROM txoutbox_attempts a
    WHERE a.finished_at > now() - make_interval(secs => $1) AND a.destination IS NOT NULL
      AND a.outcome IN ('delivered', 'retry', 'failed', 'expired', 'unknown')
    GROUP BY 1
    UNION ALL
    SELECT COALESCE(
            (SELECT m.destination FROM txoutbox_messages m WHERE m.id = a.message_id),
            (SELECT x.destination FROM txoutbox_discarded x WHERE x.id = a.message_id),
            (SELECT d.destination FROM txoutbox_delivered d WHERE d.id = a.message_id),
            '(purged)'),
        count(*), count(*) FILTER (WHERE a.outcome <> 'delivered')
    FROM txoutbox_attempt_log a
    WHERE a.finished_at > now() - make_interval(secs => $1) AND a.destination IS NULL
      AND a.outcome IN ('delivered', 'retry', 'failed', 'expired', 'unknown')
    GROUP BY 1) s
GROUP BY destination
