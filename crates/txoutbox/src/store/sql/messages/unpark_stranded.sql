-- Makes due the first row of an ordering key when it is still written waiting (its
-- `next_attempt_at` the far-future instant 9999-12-31 00:00:00+00 of `messages/insert.sql`) with
-- no earlier row left: a row whose head left the hot table by a path that could not see it (a
-- DELETE by hand, a discard or purge that raced its enqueue, an enqueue in a REPEATABLE READ
-- transaction whose snapshot still held the head). The relay runs it now and then as a safety
-- net; the completion, discard and purge of a head make the next row due themselves.
--
-- Bounded: it walks at most $2 ordering keys of the hot table, in key order after $1 (the last key
-- the previous sweep looked at, '' for the first), one index lookup of
-- `txoutbox_messages_ordering` per key (a skip scan: a key with 100 000 waiting rows costs what a
-- key with one does), and looks at the first row of each. Skips rows another transaction holds.
-- Returns the last key it looked at (NULL when it reached the end: the next sweep starts again
-- from '') and how many rows it made due.
--
-- Parameters:
-- $1 after: text
-- $2 keys: int8
WITH RECURSIVE walk(ordering_key, n) AS (
    (SELECT m.ordering_key, 1::int8 FROM txoutbox_messages m
        WHERE m.ordering_key > $1 ORDER BY m.ordering_key LIMIT 1)
    UNION ALL
    SELECT (SELECT m.ordering_key FROM txoutbox_messages m
            WHERE m.ordering_key > w.ordering_key ORDER BY m.ordering_key LIMIT 1), w.n + 1
    FROM walk w WHERE w.ordering_key IS NOT NULL AND w.n < $2),
heads AS (
    SELECT h.id FROM walk w CROSS JOIN LATERAL (
        SELECT m.id, m.status, m.next_attempt_at FROM txoutbox_messages m
        WHERE m.ordering_key = w.ordering_key ORDER BY m.seq LIMIT 1) h
    WHERE h.status = 'pending' AND h.next_attempt_at = TIMESTAMPTZ '9999-12-31 00:00:00+00'),
freed AS (
    SELECT m.id FROM txoutbox_messages m
    WHERE m.id = ANY(ARRAY(SELECT id FROM heads)) AND m.status = 'pending'
    FOR UPDATE SKIP LOCKED),
unparked AS (
    UPDATE txoutbox_messages m SET next_attempt_at = now()
    FROM freed f WHERE m.id = f.id RETURNING m.id)
SELECT CASE WHEN (SELECT count(*) FROM walk WHERE ordering_key IS NOT NULL) < $2 THEN NULL
        ELSE (SELECT max(ordering_key) FROM walk) END AS last_key,
    (SELECT count(*) FROM unparked) AS unparked
