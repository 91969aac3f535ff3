-- Moves delivered rows $1 back into the hot table as pending, with downstream keys $2. They get
-- a new `seq`: a redelivery queues behind the rows of its ordering key that wait now. The
-- delivering attempt a row carries (V4) moves to the attempt log, so the history stays whole.
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 keys: text[]
WITH moved AS (
    DELETE FROM txoutbox_delivered d
    USING unnest($1::uuid[], $2::text[]) AS i(id, downstream_key)
    WHERE d.id = i.id
    RETURNING d.id, d.seq, d.destination, d.payload, d.headers, i.downstream_key,
        d.ordering_key, d.created_at, d.attempts, d.downstream_key AS attempt_key, d.relay,
        d.lease_token, d.receipt, d.attempt_started_at, d.delivered_at),
kept AS (
    INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, relay,
        lease_token, outcome, receipt, started_at, finished_at)
    SELECT id, destination, attempts, attempt_key, relay, lease_token, 'delivered', receipt,
        attempt_started_at, delivered_at FROM moved WHERE relay IS NOT NULL)
INSERT INTO txoutbox_messages (id, destination, payload, headers, downstream_key,
    ordering_key, status, attempts, next_attempt_at, created_at)
SELECT id, destination, payload, headers, downstream_key, ordering_key, 'pending', 0, now(),
    created_at FROM moved ORDER BY seq
RETURNING id
