-- Discards the hot rows $1 (locked and checked `failed` or `unknown` by the caller) with the
-- operator's reason $2: moves them to `txoutbox_discarded`, logs one operator action per row
-- (attempt 0, relay `operator`, outcome `discarded`, the text $3: the reason, and who gave it when
-- known), and makes the next pending row of each one's ordering key due at once (it was written
-- waiting behind the head, or parked by a claim; the caller took the keys' enqueue locks, so a
-- row enqueued behind the head is seen). Returns the ids discarded.
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 reason: text
-- $3 note: text
WITH gone AS (
    DELETE FROM txoutbox_messages m WHERE m.id = ANY($1::uuid[])
        AND m.status IN ('failed', 'unknown')
    RETURNING m.id, m.seq, m.destination, m.payload, m.headers, m.downstream_key,
        m.ordering_key, m.attempts, m.status, m.last_error, m.created_at),
kept AS (
    INSERT INTO txoutbox_discarded (id, seq, destination, payload, headers, downstream_key,
        ordering_key, attempts, discarded_from, last_error, reason, created_at)
    SELECT id, seq, destination, payload, headers, downstream_key, ordering_key, attempts,
        status, last_error, $2, created_at FROM gone RETURNING id),
logged AS (
    INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, relay,
        outcome, error, started_at, finished_at)
    SELECT id, destination, 0, downstream_key, 'operator', 'discarded', $3, now(), now()
    FROM gone),
unparked AS (
    UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now())
    FROM (SELECT DISTINCT ON (n.ordering_key) n.id FROM txoutbox_messages n
            JOIN gone g ON n.ordering_key = g.ordering_key AND n.seq > g.seq
            WHERE n.id <> ALL($1::uuid[])
            ORDER BY n.ordering_key, n.seq) nx
    WHERE m.id = nx.id AND m.status = 'pending')
SELECT id FROM kept
