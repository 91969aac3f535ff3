-- Moves delivered rows $1 back into the hot table as pending, with downstream keys $2. They get
-- a new `seq`: a redelivery queues behind the rows of its ordering key that wait now, and, as
-- `messages/insert.sql` writes it (under the same ordering-key locks), a row with an earlier row
-- of its key (in the hot table or earlier among these) is written waiting (`next_attempt_at`
-- 9999-12-31 00:00:00+00) until that row leaves. The delivering attempt a row carries (V4) moves
-- to the attempt log, so the history stays whole.
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
SELECT r.id, r.destination, r.payload, r.headers, r.downstream_key, r.ordering_key, 'pending', 0,
    CASE WHEN r.ordering_key IS NULL THEN now()
        WHEN r.nth > 1 OR EXISTS (SELECT 1 FROM txoutbox_messages p
            WHERE p.ordering_key = r.ordering_key) THEN TIMESTAMPTZ '9999-12-31 00:00:00+00'
        ELSE now() END,
    r.created_at
FROM (SELECT m.*, row_number() OVER (PARTITION BY m.ordering_key ORDER BY m.seq) AS nth
    FROM moved m) r
ORDER BY r.seq
RETURNING id
