-- The end the two claims share, `messages/claim.sql` and `messages/claim_unbounded.sql`, from
-- `blocked` to the UPDATE of `claimed` (its RETURNING list is each claim's): from the
-- `candidates` (due rows, locked), the rows waiting behind an earlier row of their ordering key
-- are found (`blocked`), their keys' due queues from the first of them on are locked (`queued`,
-- skipping rows locked elsewhere) and parked, and up to $1 of the other candidates claimed under
-- a new lease.
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
