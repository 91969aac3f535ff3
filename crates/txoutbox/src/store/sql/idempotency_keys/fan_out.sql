-- Moves the effects of up to $1 keys, oldest first, into `txoutbox_messages` (the relay's
-- fan-out, for scopes with deferred effects): one row per effect, due at once, enqueued at the
-- key's time; the keys keep their response and carry no effects any more. Skips keys $2
-- (`scope\nkey`: keys this relay found poisoned) and keys another relay is fanning out; with
-- $3 and $4 set, only that key. An effect whose (destination, downstream key) is already in the
-- hot table is not written twice. Returns how many keys it emptied and how many rows it
-- wrote.
--
-- Its commit does not wait for the WAL flush (`synchronous_commit` off for this statement's
-- transaction alone): a crash can lose the fan-out only whole, and the key rows then still carry
-- the effects, fanned out again. The claim that takes the rows commits with a flush, which
-- makes the fan-out before it durable too (the WAL is flushed in order): no sink is called for a
-- row whose fan-out could still be lost.
--
-- Parameters:
-- $1 limit: int8
-- $2 skip: text[]
-- $3 scope: text
-- $4 key: text
WITH k AS (
    SELECT scope, key, effects, created_at FROM txoutbox_idempotency_keys
    WHERE effects IS NOT NULL AND NOT (scope || chr(10) || key = ANY($2::text[]))
        AND ($3::text IS NULL OR (scope = $3 AND key = $4))
    ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED),
written AS (
    INSERT INTO txoutbox_messages (id, destination, payload, headers, downstream_key,
        created_at)
    SELECT e.id, e.destination, e.payload, COALESCE(e.headers, '{}'), e.downstream_key,
        k.created_at
    FROM k CROSS JOIN LATERAL jsonb_to_recordset(k.effects)
        AS e(id uuid, destination text, payload jsonb, headers jsonb, downstream_key text)
    ORDER BY k.created_at
    ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING 1),
emptied AS (
    UPDATE txoutbox_idempotency_keys t SET effects = NULL FROM k
    WHERE t.scope = k.scope AND t.key = k.key RETURNING 1)
SELECT (SELECT count(*) FROM emptied), (SELECT count(*) FROM written),
    set_config('synchronous_commit', 'off', true)
