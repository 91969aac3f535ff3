-- `messages/claim.sql` for a relay that bounds no destination itself, while no destination has a
-- flow-control state: the same claim without the flow-control branches, which are most of the
-- statement's planning time (about 2.3 of its 3.5 ms on a small table). `flow` says whether a
-- destination has a state now (paused, throttled, a breaker not closed, a rate limit, failures
-- counted);
-- then this claims nothing, and the relay claims again with `messages/claim.sql`. The test and the claim
-- read one snapshot, so a row is claimed here only when `messages/claim.sql` would also have claimed it.
-- Takes `messages/claim.sql`'s parameters and leaves $6 and $7 unread.
--
-- The end of the statement, from `blocked` to the UPDATE of `claimed`, is
-- `parts/claim_end.sql`, the same in `messages/claim.sql` and `messages/claim_unbounded.sql`:
-- from the `candidates` (due rows, locked), the rows waiting behind an earlier row of their
-- ordering key are found (`blocked`), their keys' due queues from the first of them on are locked
-- (`queued`, skipping rows locked elsewhere) and parked, and up to $1 of the other candidates
-- claimed under a new lease.
--
-- Parameters:
-- $1 limit: int8
-- $2 owner: text
-- $3 lease_secs: float8
-- $4 held: uuid[]
-- $5 ordering_park_secs: float8
-- $6 bounded: text[]
-- $7 room: int8[]
-- $8 dead_head_park_secs: float8
WITH guard AS (
    SELECT EXISTS (SELECT 1 FROM txoutbox_destinations d
        WHERE d.paused_at IS NOT NULL OR d.rate_per_sec IS NOT NULL OR d.breaker <> 'closed'
            OR d.failures > 0 OR d.throttled_until > now()) AS flow),
candidates AS (
    SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m
    WHERE m.status = 'pending' AND m.next_attempt_at <= now() AND m.id <> ALL($4::uuid[])
        AND NOT (SELECT flow FROM guard)
    ORDER BY m.next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED),
\i messages/parts/claim_end.sql
    RETURNING m.id, m.destination, m.payload::text AS payload, m.headers::text AS headers,
        m.downstream_key, m.ordering_key, m.attempts, m.lease_token, m.created_at,
        m.attempt_started_at)
SELECT g.flow, p.parked,
    CASE WHEN row_number() OVER () = 1 THEN p.parked_ids END AS parked_ids,
    NULL::text AS gates, c.* FROM guard g
    CROSS JOIN (SELECT (SELECT count(*) FROM parked) AS parked, ARRAY(
        SELECT DISTINCT ON (f.ordering_key) f.id FROM parked f
        ORDER BY f.ordering_key, f.seq) AS parked_ids) p
    LEFT JOIN claimed c ON true
