-- Why: a request through the full path wrote three rows (its key, then one outbox row per effect)
-- and seven index entries, and the request path's cost is what a team weighs before adopting an
-- outbox. A scope with deferred effects (`Scope::with_deferred_effects`) now writes ONE row per
-- request, however many effects: the key row carries the response and the effects, and the relay
-- fans the effects out into txoutbox_messages in batches, off the request path. Effects with an
-- ordering key or a caller-given downstream key are still written as rows at once (their commit
-- order and their deduplication are decided at enqueue). Nothing existing moves: keys stored
-- before V5 have no effects to fan out.

-- The request's effects not yet in txoutbox_messages: a JSON array of
-- {id, destination, payload, headers, downstream_key}; NULL once the relay has fanned them out
-- (or when there were none). A key whose effects are still here is never pruned.
ALTER TABLE txoutbox_idempotency_keys ADD COLUMN effects jsonb;

-- The relay's fan-out reads the oldest keys that still carry effects: only those are in it, so it
-- stays as small as the fan-out's backlog.
CREATE INDEX txoutbox_idempotency_keys_effects ON txoutbox_idempotency_keys (created_at)
    WHERE effects IS NOT NULL;

-- Refuses the statement that stores a request's key with an error of txoutbox's own, so that a
-- COMMIT sent right behind it (`Claim::commit` sends both in one round trip) rolls everything back:
-- TXK01 the key was claimed in another transaction, TXK02 a concurrent request stored the key
-- first, TXK03 `Claim::commit` was given a transaction with a savepoint open (its COMMIT would
-- commit the outer transaction too). Called only on those paths.
CREATE FUNCTION txoutbox_refuse(code text, message text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
END
$$;
