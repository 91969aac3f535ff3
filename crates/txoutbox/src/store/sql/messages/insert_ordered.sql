-- `messages/insert.sql` for a batch in which a message has an ordering key (the batches without
-- one keep that plainer statement, with no window nor lookup): inserts the messages, a
-- (destination, downstream key) already present skipped; returns the id and destination of each
-- row written.
--
-- A row with an ordering key that has an earlier row (in the hot table, whatever its status, or
-- earlier in the batch) is written waiting: its `next_attempt_at` is the far-future instant
-- 9999-12-31 00:00:00+00, out of every claim's due range, until the row ahead leaves the hot
-- table and its completion, discard or purge makes it due. Only the first row of a key is ever
-- due, so rows queued behind a dead head are never read nor updated by a claim. The caller holds
-- the key's advisory lock (`lock_ordering_keys.sql`): no other transaction writes a row of the
-- key meanwhile. The earlier row is an index lookup in `txoutbox_messages_ordering`, made only
-- for rows with an ordering key (the CASE stops before it for the others); the batch's own
-- earlier rows are counted by `row_number` over the key.
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 destinations: text[]
-- $3 payloads: jsonb[]
-- $4 headers: jsonb[]
-- $5 downstream_keys: text[]
-- $6 ordering_keys: text[]
INSERT INTO txoutbox_messages
(id, destination, payload, headers, downstream_key, ordering_key, next_attempt_at)
SELECT i.id, i.destination, i.payload, i.headers, i.downstream_key, i.ordering_key,
    CASE WHEN i.ordering_key IS NULL THEN now()
        WHEN i.nth > 1 OR EXISTS (SELECT 1 FROM txoutbox_messages p
            WHERE p.ordering_key = i.ordering_key) THEN TIMESTAMPTZ '9999-12-31 00:00:00+00'
        ELSE now() END
FROM (SELECT u.*, row_number() OVER (PARTITION BY u.ordering_key ORDER BY u.n) AS nth
    FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::text[], $6::text[])
        WITH ORDINALITY AS u(id, destination, payload, headers, downstream_key, ordering_key, n)) i
ORDER BY i.n
ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination
