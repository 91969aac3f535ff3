-- `messages/claim.sql` for a relay that bounds no destination itself, while no destination has a
-- flow-control state: the same claim without the flow-control branches, which are most of the
-- statement's planning time (about 2.3 of its 3.5 ms on a small table). `flow` says whether a
-- destination has a state now (paused, throttled, a breaker not closed, a rate limit, failures
-- counted);
-- then this claims nothing, and the relay claims again with `messages/claim.sql`. The test and the claim
-- read one snapshot, so a row is claimed here only when `messages/claim.sql` would also have claimed it.
-- Takes `messages/claim.sql`'s parameters and leaves $6 and $7 unread.
--
-- The end of the statement (from `blocked`) is the same in `messages/claim.sql` and
-- `messages/claim_unbounded.sql`: from the `candidates` (due rows, locked), the rows waiting
-- behind an earlier row of their ordering key are found (`blocked`), their keys' due queues from
-- the first of them on are locked (`queued`, skipping rows locked elsewhere) and parked, and up
-- to $1 of the other candidates claimed under a new lease. Change them together.
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
blocked AS (
    SELECT c.id, c.ordering_key, c.seq, head.dead FROM candidates c CROSS JOIN LATERAL (
        SELECT p.status IN ('failed', 'unknown') AS dead FROM txoutbox_messages p
        WHERE p.ordering_key = c.ordering_key AND p.seq < c.seq ORDER BY p.seq LIMIT 1) head
    WHERE c.ordering_key IS NOT NULL),
blocked_keys AS (
    SELECT b.ordering_key, min(b.seq) AS seq, bool_or(b.dead) AS dead FROM blocked b
    GROUP BY b.ordering_key),
queued AS (
    SELECT q.ctid FROM blocked_keys k CROSS JOIN LATERAL (
        SELECT m.ctid FROM txoutbox_messages m
        WHERE m.ordering_key = k.ordering_key AND m.seq >= k.seq AND m.status = 'pending'
            AND m.next_attempt_at <= now()
        ORDER BY m.seq
        FOR UPDATE SKIP LOCKED) q
    LIMIT 10000),
parked AS (
    UPDATE txoutbox_messages m SET next_attempt_at = now() + make_interval(secs =>
        CASE WHEN m.ordering_key = ANY(ARRAY(SELECT ordering_key FROM blocked_keys WHERE dead))
            THEN $8 ELSE $5 END)
    WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM queued))
    RETURNING m.id, m.ordering_key, m.seq),
due AS (
    SELECT c.id FROM candidates c WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
    ORDER BY c.next_attempt_at LIMIT $1),
claimed AS (
    UPDATE txoutbox_messages m SET status = 'in_flight', lease_owner = $2,
        lease_expires_at = now() + make_interval(secs => $3),
        lease_token = nextval('txoutbox_lease_token_seq'), attempts = m.attempts + 1,
        attempt_started_at = now(), at_most_once = false
    WHERE m.id = ANY(ARRAY(SELECT id FROM due))
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
