-- One message, from whichever table holds it.
--
-- Parameters:
-- $1 id: uuid
SELECT id, seq, destination, status, downstream_key, ordering_key,
    attempts, created_at, next_attempt_at, NULL::timestamptz AS delivered_at, last_error,
    lease_owner, lease_expires_at, NULL::timestamptz AS discarded_at, payload::text,
    headers::text, NULL::text AS receipt
FROM txoutbox_messages WHERE id = $1
UNION ALL
SELECT id, seq, destination, 'delivered', downstream_key, ordering_key, attempts,
    created_at, NULL, delivered_at, NULL, NULL, NULL, NULL, payload::text, headers::text,
    receipt
FROM txoutbox_delivered WHERE id = $1
UNION ALL
SELECT id, seq, destination, 'discarded', downstream_key, ordering_key, attempts,
    created_at, NULL, NULL, last_error, NULL, NULL, discarded_at, payload::text,
    headers::text, NULL
FROM txoutbox_discarded WHERE id = $1
