-- The relay's completion fence: takes the enqueue locks of ordering keys $1 as
-- `messages/lock_ordering_keys.sql` does (same hash, same order), waiting at most $2 milliseconds
-- for each (the relay's `ordering_lock_wait`, 200 ms by default), then gives the transaction back
-- its own `lock_timeout`. An enqueue transaction may take the
-- locks of several calls in another order than this statement's and so wait for a lock the
-- completion holds while the completion waits for one of its own: the completion gives up
-- (SQLSTATE 55P03) before the deadlock detector (`deadlock_timeout`, 1 s by default) would pick a
-- victim, which could be the caller's transaction; the relay then completes without the fence
-- (`messages/unpark_stranded.sql` is the net). A wait this long means an enqueue transaction
-- holding a key for long: the completion does not wait for it either. `lock_timeout` is set
-- before the first lock is asked (the LATERAL subquery reads the set_config of `s`, so it runs
-- after it) and read by each wait as it starts.
--
-- Parameters:
-- $1 keys: text[]
-- $2 wait_ms: int8
SELECT set_config('lock_timeout', s.previous, true), l.n FROM (
    SELECT current_setting('lock_timeout') AS previous,
        set_config('lock_timeout', $2::text, true) AS bounded) s
CROSS JOIN LATERAL (
    SELECT count(pg_advisory_xact_lock(h)) AS n FROM (
        SELECT DISTINCT hashtextextended(k, 7160) AS h FROM unnest($1::text[]) AS k
        WHERE s.bounded IS NOT NULL ORDER BY h) AS keys) l
