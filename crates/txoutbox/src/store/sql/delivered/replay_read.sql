-- `delivered/replay_lock.sql` without the locks, for a dry run.
--
-- Parameters:
-- $1 ids: uuid[]
SELECT id, destination, downstream_key, ordering_key
FROM txoutbox_delivered WHERE id = ANY($1::uuid[]) ORDER BY id
