-- The heartbeat of relay $1: its last claim $2 (NULL: unchanged) and the rows it holds $3.
-- Returns the relays alive (this one and those whose heartbeat is under three of their
-- intervals old); no row when this relay's row is gone (pruned, deleted by hand).
--
-- Parameters:
-- $1 owner: text
-- $2 last_claim: timestamptz
-- $3 held: int4
UPDATE txoutbox_relays SET heartbeat_at = now(),
    last_claim_at = COALESCE($2, last_claim_at), held = $3
WHERE owner = $1
RETURNING 1 + (SELECT count(*) FROM txoutbox_relays o
    WHERE o.owner <> $1 AND o.heartbeat_at > now() - 3 * o.heartbeat_every)
