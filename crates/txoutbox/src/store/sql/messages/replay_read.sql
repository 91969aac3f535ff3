-- `messages/replay_lock.sql` without the locks, for a dry run.
--
-- Parameters:
-- $1 ids: uuid[]
SELECT id, status, destination, downstream_key, ordering_key,
    lease_owner, lease_expires_at, COALESCE(lease_expires_at > now(), false)
FROM txoutbox_messages WHERE id = ANY($1::uuid[]) ORDER BY id
