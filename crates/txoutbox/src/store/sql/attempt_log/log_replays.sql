-- Logs one operator replay per row: attempt 0, relay `operator`, outcome `replayed`, the key the
-- row carries from now on, and a note ($3) saying what changed.
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 keys: text[]
-- $3 notes: text[]
INSERT INTO txoutbox_attempt_log (message_id, attempt,
    downstream_key, relay, outcome, error, started_at, finished_at)
SELECT i.id, 0, i.downstream_key, 'operator', 'replayed', i.note, now(), now()
FROM unnest($1::uuid[], $2::text[], $3::text[]) AS i(id, downstream_key, note)
