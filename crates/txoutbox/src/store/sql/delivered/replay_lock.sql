-- Locks the delivered rows among $1 (the pruner skips locked rows).
--
-- Parameters:
-- $1 ids: uuid[]
SELECT id, destination, downstream_key, ordering_key
FROM txoutbox_delivered WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE
