-- Locks the hot rows among $1 (in id order, so two operators cannot deadlock). A relay's claim
-- skips locked rows and its completion waits for them, so nothing changes them until commit.
--
-- Parameters:
-- $1 ids: uuid[]
SELECT id, status, destination, downstream_key, ordering_key,
    lease_owner, lease_expires_at, COALESCE(lease_expires_at > now(), false)
FROM txoutbox_messages WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE
