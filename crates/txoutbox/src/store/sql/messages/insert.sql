-- Inserts a batch of messages; a (destination, downstream key) already present is skipped.
-- Returns the id and destination of each row written. For a batch without ordering keys: a
-- batch with one is written by `messages/insert_ordered.sql`, which writes a row behind an
-- earlier row of its key waiting.
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 destinations: text[]
-- $3 payloads: jsonb[]
-- $4 headers: jsonb[]
-- $5 downstream_keys: text[]
-- $6 ordering_keys: text[]
INSERT INTO txoutbox_messages
(id, destination, payload, headers, downstream_key, ordering_key)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::text[],
    $6::text[])
ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination
