-- Commits the start of an at-most-once attempt ($1, under lease token $2) just before its sink
-- is called: from here on a lost outcome makes the row `unknown`, not pending. Returns no row
-- when the lease is no longer ours (then the call is not made).
--
-- Parameters:
-- $1 id: uuid
-- $2 token: int8
UPDATE txoutbox_messages SET at_most_once = true
WHERE id = $1 AND lease_token = $2 RETURNING 1
