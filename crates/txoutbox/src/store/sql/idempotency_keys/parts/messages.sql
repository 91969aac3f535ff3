-- The opening of `complete_*_with_messages.sql` (the others open `WITH stored AS (`): the
-- request's outbox rows ($12..$17, a (destination, downstream key) already present skipped),
-- then `stored`, the key row's write. Rows among which one has an ordering key are written by
-- `parts/ordered_messages.sql` instead.
WITH messages AS (
    INSERT INTO txoutbox_messages (id, destination, payload, headers, downstream_key, ordering_key)
SELECT * FROM unnest($12::uuid[], $13::text[], $14::jsonb[], $15::jsonb[], $16::text[],
    $17::text[])
ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination),
stored AS (
