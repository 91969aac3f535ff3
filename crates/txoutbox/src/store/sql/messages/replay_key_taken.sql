-- The hot rows that already carry a (destination, downstream key) of delivered rows about to be
-- moved back (the same effect enqueued again after its delivery): pairs (delivered id, hot id).
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 destinations: text[]
-- $3 keys: text[]
SELECT i.id, m.id
FROM unnest($1::uuid[], $2::text[], $3::text[]) AS i(id, destination, downstream_key)
JOIN txoutbox_messages m ON m.destination = i.destination
    AND m.downstream_key = i.downstream_key AND m.id <> i.id
