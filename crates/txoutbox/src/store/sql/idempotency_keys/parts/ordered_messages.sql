-- The opening of `complete_*_with_ordered_messages.sql`: `parts/messages.sql` for outbox rows
-- among which one has an ordering key. A row with an ordering key that has an earlier row (in
-- the hot table or earlier in the batch) is written waiting, as by `messages/insert_ordered.sql`.
WITH messages AS (
    INSERT INTO txoutbox_messages
    (id, destination, payload, headers, downstream_key, ordering_key, next_attempt_at)
SELECT i.id, i.destination, i.payload, i.headers, i.downstream_key, i.ordering_key,
    CASE WHEN i.ordering_key IS NULL THEN now()
        WHEN i.nth > 1 OR EXISTS (SELECT 1 FROM txoutbox_messages p
            WHERE p.ordering_key = i.ordering_key) THEN TIMESTAMPTZ '9999-12-31 00:00:00+00'
        ELSE now() END
FROM (SELECT u.*, row_number() OVER (PARTITION BY u.ordering_key ORDER BY u.n) AS nth
    FROM unnest($12::uuid[], $13::text[], $14::jsonb[], $15::jsonb[], $16::text[],
        $17::text[])
        WITH ORDINALITY AS u(id, destination, payload, headers, downstream_key, ordering_key, n)) i
ORDER BY i.n
ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination),
stored AS (
