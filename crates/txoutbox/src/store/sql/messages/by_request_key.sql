-- The messages a request enqueued, from whichever table holds them: those whose downstream key
-- is one derived from the claim ($2), and those written by the claim's transaction (their
-- `created_at`, the transaction's time, equals the key's, $1). Oldest first.
--
-- Parameters:
-- $1 claimed_at: timestamptz
-- $2 derived: text[]
SELECT * FROM (
SELECT t.id, t.seq, t.destination, t.status, t.downstream_key, t.ordering_key, t.attempts,
    t.created_at, t.next_attempt_at, NULL::timestamptz AS delivered_at, t.last_error,
    t.lease_owner, t.lease_expires_at, NULL::timestamptz AS discarded_at
FROM txoutbox_messages t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[])
UNION ALL
SELECT t.id, t.seq, t.destination, 'delivered', t.downstream_key, t.ordering_key,
    t.attempts, t.created_at, NULL, t.delivered_at, NULL, NULL, NULL, NULL
FROM txoutbox_delivered t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[])
UNION ALL
SELECT t.id, t.seq, t.destination, 'discarded', t.downstream_key, t.ordering_key,
    t.attempts, t.created_at, NULL, NULL, t.last_error, NULL, NULL, t.discarded_at
FROM txoutbox_discarded t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[])
) r ORDER BY created_at, seq
