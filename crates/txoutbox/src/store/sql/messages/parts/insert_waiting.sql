-- The insert of a batch of messages among which one has an ordering key, from a `batch` the
-- including statement defines (columns id, destination, payload, headers, downstream_key,
-- ordering_key, n: the batch's order), in `messages/insert_ordered.sql` and
-- `idempotency_keys/parts/ordered_messages.sql`: a (destination, downstream key) already present
-- is skipped; a row with an ordering key that has an earlier row (in the hot table, whatever its
-- status, or earlier in the batch) is written waiting (`next_attempt_at` 9999-12-31 00:00:00+00).
-- Returns the id and destination of each row written.
INSERT INTO txoutbox_messages
    (id, destination, payload, headers, downstream_key, ordering_key, next_attempt_at)
SELECT i.id, i.destination, i.payload, i.headers, i.downstream_key, i.ordering_key,
    CASE WHEN i.ordering_key IS NULL THEN now()
        WHEN i.nth > 1 OR EXISTS (SELECT 1 FROM txoutbox_messages p
            WHERE p.ordering_key = i.ordering_key) THEN TIMESTAMPTZ '9999-12-31 00:00:00+00'
        ELSE now() END
FROM (SELECT b.*, row_number() OVER (PARTITION BY b.ordering_key ORDER BY b.n) AS nth
    FROM batch b) i
ORDER BY i.n
ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination
