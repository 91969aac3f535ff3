-- At shutdown, gives back every row this relay ($1) still holds whose sink was never called
-- (not one of $2, the rows whose call started): pending again at once, the attempt not counted.
-- It catches what a claim cut short by the shutdown committed after the relay stopped waiting.
--
-- Parameters:
-- $1 owner: text
-- $2 called: uuid[]
UPDATE txoutbox_messages SET status = 'pending',
attempts = greatest(attempts - 1, 0), lease_owner = NULL, lease_expires_at = NULL,
lease_token = NULL, at_most_once = false
WHERE status = 'in_flight' AND lease_owner = $1 AND id <> ALL($2::uuid[]) RETURNING id
