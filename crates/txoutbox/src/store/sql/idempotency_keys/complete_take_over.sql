-- Stores a claimed key at the end of its request: the key row, completed with the response
-- (status $4, headers $5, body $6) and the effects it carries for the relay's fan-out ($8, NULL
-- for none), in one statement, so that they commit or roll back together. One of six
-- variants (three ways to write the key row, each without and with outbox rows to write now),
-- chosen by `CompleteKey::statement`; the six differ only where this comment says.
--
-- The key row is written over the expired key the lookup found (READ COMMITTED): it is taken
-- over, its effects kept (see below). A live key (stored meanwhile by a request that took no
-- lock) is left alone, and the statement refused (TXK02).
--
-- The key row's effects once a request has stored its own: those of an earlier request of the
-- key, taken over after its window but not fanned out yet, are kept, with this request's after
-- them. Every write of a key row's effects does this, so no request's effects are ever written
-- over.
--
-- Answers one row: the outbox rows written (their ids and destinations, NULL when none was: all
-- were already enqueued, or there were none to write), after the checks that make the statement
-- fail, so that its writes are undone and a COMMIT sent behind it rolls back instead
-- (`txoutbox_refuse`): the key stored in another transaction than its claim's (the claim's
-- backend $9 and time $10; TXK01), a key stored first by a concurrent request (no row `stored`;
-- TXK02), and, when $11 asks, a savepoint open (the key row's `xmin` is then a
-- subtransaction's, not the top-level transaction's; TXK03). `stored` is read once.
--
-- Parameters:
-- $1 scope: text
-- $2 key: text
-- $3 fingerprint: bytea
-- $4 status: int2
-- $5 headers: jsonb
-- $6 body: bytea
-- $7 window_secs: float8
-- $8 effects: jsonb
-- $9 backend_pid: int4
-- $10 claimed_at: timestamptz
-- $11 outermost: bool
WITH stored AS (
INSERT INTO txoutbox_idempotency_keys AS k (scope, key, fingerprint, state,
    response_status, response_headers, response_body, created_at, expires_at, effects)
VALUES ($1, $2, $3, 'completed', $4, $5, $6, now(), now() + make_interval(secs => $7), $8)
ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
    state = 'completed', response_status = EXCLUDED.response_status,
    response_headers = EXCLUDED.response_headers, response_body = EXCLUDED.response_body,
    created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
    effects = CASE WHEN k.effects IS NULL THEN $8::jsonb
        WHEN $8::jsonb IS NULL THEN k.effects ELSE k.effects || $8::jsonb END
WHERE k.expires_at <= now()
RETURNING k.xmin = pg_current_xact_id()::xid AS outermost)
SELECT NULL::uuid[], NULL::text[],
    CASE WHEN pg_backend_pid() <> $9 OR now() <> $10
        THEN txoutbox_refuse('TXK01', 'the claimed key is not in this transaction')
    WHEN s.outermost IS NULL
        THEN txoutbox_refuse('TXK02', 'a concurrent request stored the key first')
    WHEN $11 AND NOT s.outermost
        THEN txoutbox_refuse('TXK03', 'Claim::commit was given a transaction with a savepoint open; complete it and commit the outermost transaction')
    ELSE 0 END
FROM (SELECT bool_and(outermost) AS outermost FROM stored) AS s
