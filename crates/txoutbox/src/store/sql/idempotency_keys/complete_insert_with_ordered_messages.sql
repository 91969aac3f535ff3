-- `idempotency_keys/complete_insert_with_messages.sql` for outbox rows among which one has an
-- ordering key (`parts/ordered_messages.sql` in place of `parts/messages.sql`: a row behind an
-- earlier row of its key is written waiting); the batches without one keep that statement, with
-- no window nor lookup. What follows is that statement's comment.
--
-- Stores a claimed key at the end of its request: the key row, completed with the response (status
-- $4, headers $5, body $6) and the effects it carries for the relay's fan-out ($8, NULL for none),
-- with the request's outbox rows ($12..$17, in the first CTE: a (destination, downstream key)
-- already present is skipped), in one statement, so that they commit or roll back together. One of
-- six variants (three ways to write the key row, each without and with outbox rows to write now),
-- chosen by `CompleteKey::statement`; the six differ only where this comment says.
--
-- The key row is inserted now (READ COMMITTED: the lock of `lock_try.sql` serialises the requests
-- of a key, so this is the key's only write). A plain insert, with no speculative insertion, when
-- the lookup found no key: a key inserted meanwhile by a request that took no lock (a txoutbox
-- before V5) makes it fail with a unique violation.
--
-- The key row's effects once a request has stored its own: those of an earlier request of the
-- key, taken over after its window but not fanned out yet, are kept, with this request's after
-- them (`parts/kept_effects.sql`).
--
-- Answers one row: the outbox rows written (their ids and destinations, NULL when none was: all
-- were already enqueued, or there were none to write), after the checks that make the statement
-- fail (TXK01 to TXK03, `parts/checks.sql`). The text the six share is in
-- `idempotency_keys/parts/`, each part in its place by a `\i` line (`store/statements.rs`).
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
-- $12 ids: uuid[]
-- $13 destinations: text[]
-- $14 payloads: jsonb[]
-- $15 headers: jsonb[]
-- $16 downstream_keys: text[]
-- $17 ordering_keys: text[]
\i idempotency_keys/parts/ordered_messages.sql
\i idempotency_keys/parts/insert_key.sql
RETURNING k.xmin = pg_current_xact_id()::xid AS outermost)
SELECT (SELECT array_agg(id) FROM messages), (SELECT array_agg(destination) FROM messages),
\i idempotency_keys/parts/checks.sql
