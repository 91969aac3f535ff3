-- Why: the whole of txoutbox's state. Idempotency keys, outbox rows, the delivered history and the
-- attempt log live in the service's own database so that a request's business writes, its key and its
-- outbox rows commit in ONE transaction. Never edit this file once shipped: add V2, V3, ...

-- One row per (scope, key) a client sent. Inserted inside the business transaction: the unique key
-- serialises concurrent requests with the same key on its row lock.
CREATE TABLE txoutbox_idempotency_keys (
    -- the key's namespace (tenant, account or route): the same key under two scopes is two keys
    scope            text        NOT NULL,
    -- the client's Idempotency-Key header value (1..=255 visible ASCII, checked by the library)
    key              text        NOT NULL,
    -- SHA-256 of method, route and canonical body: a retry must be the same request (else 422)
    fingerprint      bytea       NOT NULL,
    -- 'in_flight' while the first request's transaction runs, 'completed' once its response is stored
    state            text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    -- the stored response, replayed to every retry: status code,
    response_status  smallint,
    -- its headers as a JSON array of [name, value] pairs (order and repeats preserved),
    response_headers jsonb,
    -- and its body bytes, exactly as first sent
    response_body    bytea,
    -- when the first request claimed the key (for operators and for the window below)
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- end of the key's window (per scope, 24 h by default); after it the key is pruned and new again
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
-- the pruner deletes expired keys in bounded batches, oldest first. Keys arrive in roughly
-- expiry order (now + the scope's window), so a BRIN index serves the pruner at a fraction of a
-- B-tree's cost on the write path.
CREATE INDEX txoutbox_idempotency_keys_expires_at ON txoutbox_idempotency_keys
    USING brin (expires_at);

-- Gives every claim a new fencing token: a relay whose lease expired holds an old token and cannot
-- complete a row another relay has claimed since.
CREATE SEQUENCE txoutbox_lease_token_seq;

-- The hot outbox: rows waiting for delivery, being delivered, or stopped for an operator.
-- Delivered rows leave this table (moved to txoutbox_delivered), so it and its indexes stay small.
CREATE TABLE txoutbox_messages (
    -- UUIDv7: unique across services without coordination, and roughly time ordered
    id               uuid        PRIMARY KEY,
    -- insertion order; within one ordering key it is commit order (enqueue locks the ordering key)
    seq              bigint      GENERATED ALWAYS AS IDENTITY,
    -- which registered sink delivers the row ('email', 'stripe', 'webhook:orders', ...)
    destination      text        NOT NULL,
    -- the effect's typed payload, serialised by the caller's serde types
    payload          jsonb       NOT NULL,
    -- extra metadata forwarded to the sink (trace context, content type); a JSON object of strings
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- the key forwarded downstream (Stripe Idempotency-Key, Message-ID, webhook-id); the same on
    -- every attempt, so the downstream deduplicates redeliveries
    downstream_key   text        NOT NULL,
    -- rows sharing an ordering key are delivered one at a time, in commit order; NULL = unordered
    ordering_key     text,
    -- 'pending' (due at next_attempt_at), 'in_flight' (leased by a relay), 'failed' (dead-lettered),
    -- 'unknown' (an at-most-once attempt whose outcome was lost: an operator decides)
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'in_flight', 'failed', 'unknown')),
    -- attempts made so far (claims); compared with the destination's max attempts
    attempts         integer     NOT NULL DEFAULT 0,
    -- when the row is next due; backoff pushes it forward, replay sets it to now()
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    -- the relay holding the lease (its owner id), for operators and for release at shutdown
    lease_owner      text,
    -- when the lease ends; past it the row is claimable again by any relay
    lease_expires_at timestamptz,
    -- the fencing token of the current claim (from txoutbox_lease_token_seq)
    lease_token      bigint,
    -- when the current attempt started; the claim commits it before the sink is called
    attempt_started_at timestamptz,
    -- set by the claiming relay for at-most-once destinations: a lease that expires mid-attempt
    -- then moves the row to 'unknown' instead of back to 'pending'
    at_most_once     boolean     NOT NULL DEFAULT false,
    -- the last failure's text, shown by `txoutbox list/show`
    last_error       text,
    -- when the business transaction enqueued the row (commit -> delivery latency, backlog age)
    created_at       timestamptz NOT NULL DEFAULT now()
);
-- The claim query's index: only due pending rows are in it, so claiming costs the same whatever the
-- history. The literal 'pending' must stay literal in the claim query for the planner to use it.
CREATE INDEX txoutbox_messages_due ON txoutbox_messages (next_attempt_at) WHERE status = 'pending';
-- An ordered row is claimable only when no earlier row of its ordering key is still here.
CREATE INDEX txoutbox_messages_ordering ON txoutbox_messages (ordering_key, seq)
    WHERE ordering_key IS NOT NULL;
-- Expired leases are found and reclaimed without scanning pending rows.
CREATE INDEX txoutbox_messages_lease ON txoutbox_messages (lease_expires_at) WHERE status = 'in_flight';
-- Enqueue deduplicates: one effect (destination, downstream key) is one row, however often enqueued.
CREATE UNIQUE INDEX txoutbox_messages_dedup ON txoutbox_messages (destination, downstream_key);

-- Delivered rows, moved here by the relay in the completion statement. Pruned after a retention
-- (7 days by default); nothing on the relay's hot path reads it.
CREATE TABLE txoutbox_delivered (
    -- the outbox row's id, unchanged
    id               uuid        PRIMARY KEY,
    -- the row's insertion order, kept for listing
    seq              bigint      NOT NULL,
    -- as in txoutbox_messages
    destination      text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb       NOT NULL,
    downstream_key   text        NOT NULL,
    ordering_key     text,
    -- how many attempts it took
    attempts         integer     NOT NULL,
    -- enqueue time and delivery time: their difference is the delivery latency
    created_at       timestamptz NOT NULL,
    delivered_at     timestamptz NOT NULL DEFAULT now(),
    -- the downstream's receipt (Stripe object id, SMTP reply, publish ack)
    receipt          text
);
-- retention pruning deletes the oldest delivered rows first; rows arrive in delivered_at order,
-- so a BRIN index finds them at a fraction of a B-tree's cost on the relay's hot path
CREATE INDEX txoutbox_delivered_delivered_at ON txoutbox_delivered USING brin (delivered_at);
-- a replayed or re-enqueued effect is found by its downstream key
CREATE INDEX txoutbox_delivered_key ON txoutbox_delivered (destination, downstream_key);

-- Every delivery attempt and operator action on a row: why it failed, when, with which key.
CREATE TABLE txoutbox_attempts (
    -- the outbox row (not a foreign key: delivered rows move to txoutbox_delivered)
    message_id       uuid        NOT NULL,
    -- 1, 2, 3 ...: the row's attempt counter at this attempt (0 for operator actions)
    attempt          integer     NOT NULL,
    -- the downstream key the attempt carried (it changes only on a replay with --new-key)
    downstream_key   text        NOT NULL,
    -- the relay that made the attempt, or 'operator' for a replay
    relay            text        NOT NULL,
    -- the fencing token of the claim the attempt ran under
    lease_token      bigint,
    -- 'delivered', 'retry', 'failed' (dead-lettered), 'expired' (the lease ran out mid-attempt),
    -- 'lease_lost' (an outcome that came after another relay took the row), 'released' (given
    -- back at shutdown), 'replayed' (an operator's replay)
    outcome          text        NOT NULL,
    -- the error text of a failed attempt
    error            text,
    -- the downstream's receipt of a delivered attempt
    receipt          text,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL DEFAULT now()
);
-- `txoutbox show ID` reads a row's attempts in order
CREATE INDEX txoutbox_attempts_message ON txoutbox_attempts (message_id, started_at);
-- pruning and failure-rate statistics read recent attempts; append-only in time order: BRIN
CREATE INDEX txoutbox_attempts_finished_at ON txoutbox_attempts USING brin (finished_at);
