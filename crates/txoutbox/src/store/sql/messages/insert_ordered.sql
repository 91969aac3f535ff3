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
-- earlier rows are counted by `row_number` over the key. The insert is
-- `parts/insert_waiting.sql`, shared with the ordered key completions.
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 destinations: text[]
-- $3 payloads: jsonb[]
-- $4 headers: jsonb[]
-- $5 downstream_keys: text[]
-- $6 ordering_keys: text[]
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::text[], $6::text[])
        WITH ORDINALITY AS u(id, destination, payload, headers, downstream_key, ordering_key, n))
\i messages/parts/insert_waiting.sql
