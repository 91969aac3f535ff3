-- The opening of `complete_*_with_ordered_messages.sql`: `parts/messages.sql` for outbox rows
-- among which one has an ordering key. A row with an ordering key that has an earlier row (in
-- the hot table or earlier in the batch) is written waiting: `messages/parts/insert_waiting.sql`.
WITH batch AS (
    SELECT * FROM unnest($12::uuid[], $13::text[], $14::jsonb[], $15::jsonb[], $16::text[],
        $17::text[])
        WITH ORDINALITY AS u(id, destination, payload, headers, downstream_key, ordering_key, n)),
messages AS (
\i messages/parts/insert_waiting.sql
),
stored AS (
