-- Completes a batch of attempts, fenced by their lease tokens: only rows still leased under the
-- token the attempt ran with change. Delivered rows move to `txoutbox_delivered`; retried rows go
-- back to pending with their next attempt time; dead rows become `failed`; rows given back at
-- shutdown go back to pending at once (`released`: the sink may have been called; `unstarted`:
-- it was not, so the attempt is not counted), or to `unknown` for an at-most-once destination
-- whose call may have reached the downstream. Every attempt is recorded, including those whose
-- lease was lost (a completion that came too late), so `txoutbox_attempts` shows every call a
-- downstream received: a delivered row carries its delivering attempt itself (relay, lease token,
-- start; V4), every other attempt is a row of the log (an outcome that changed no row, because
-- its lease was lost, is logged as `lease_lost`). Inputs are matched to rows by (id, lease
-- token), so two outcomes of one row (an old lease's and a new one's) never collide. The next
-- row of a delivered row's ordering key is made due (`unparked`: it was written waiting, or
-- parked); a batch that delivers rows with ordering keys is run in a transaction that took
-- those keys' enqueue locks first (`messages/lock_ordering_keys.sql`), so this statement's
-- snapshot holds every row enqueued behind them.
-- Returns the ids whose completion took effect. A lease token is set only while a row is
-- in flight (claim sets it; completion, reclaim and replay clear it), so matching the token is
-- the whole fence: no `status = 'in_flight'` test, which would steer the planner to the lease
-- index and a nested loop that rescans the batch once per row. Nor `m.id = ANY($1)` beside the
-- join: the planner made it an index condition of every key lookup, so each lookup descended
-- the primary key once per id of the batch (half the statement's time for a batch of 100).
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 tokens: int8[]
-- $3 kinds: text[]
-- $4 errors: text[]
-- $5 receipts: text[]
-- $6 delays: float8[]
-- $7 started: timestamptz[]
-- $8 finished: timestamptz[]
-- $9 attempts: int4[]
-- $10 keys: text[]
-- $11 relay: text
-- $12 destinations: text[]
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::text[],
        $6::float8[], $7::timestamptz[], $8::timestamptz[], $9::int4[], $10::text[],
        $12::text[])
        AS i(id, token, kind, error, receipt, delay, started, finished, attempt, downstream_key,
            destination)),
delivered AS (
    DELETE FROM txoutbox_messages m
    WHERE (m.id, m.lease_token) IN (
        SELECT i.id, i.token FROM input i WHERE i.kind = 'delivered')
    RETURNING m.id, m.seq, m.destination, m.payload, m.headers, m.downstream_key,
        m.ordering_key, m.attempts, m.created_at, m.lease_token),
history AS (
    INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, downstream_key,
        ordering_key, attempts, created_at, delivered_at, receipt, relay, lease_token,
        attempt_started_at)
    SELECT d.id, d.seq, d.destination, d.payload, d.headers, d.downstream_key,
        d.ordering_key, d.attempts, d.created_at, i.finished, i.receipt, $11, d.lease_token,
        i.started
    FROM delivered d JOIN input i ON i.id = d.id AND i.token = d.lease_token),
unparked AS (
    UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now())
    FROM (SELECT DISTINCT ON (n.ordering_key) n.id FROM txoutbox_messages n
            JOIN delivered d ON n.ordering_key = d.ordering_key AND n.seq > d.seq
            ORDER BY n.ordering_key, n.seq) nx
    WHERE m.id = nx.id AND m.status = 'pending' AND m.id <> ALL($1::uuid[])),
updated AS (
    UPDATE txoutbox_messages m SET
        status = CASE WHEN i.kind IN ('failed', 'unknown') THEN i.kind ELSE 'pending' END,
        next_attempt_at = CASE WHEN i.kind IN ('failed', 'unknown') THEN m.next_attempt_at
            ELSE now() + make_interval(secs => i.delay) END,
        attempts = CASE WHEN i.kind = 'unstarted' THEN m.attempts - 1 ELSE m.attempts END,
        last_error = COALESCE(i.error, m.last_error),
        lease_owner = NULL, lease_expires_at = NULL, lease_token = NULL
    FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $6::float8[])
        AS i(id, token, kind, error, delay)
    WHERE m.id = i.id AND m.lease_token = i.token AND i.kind <> 'delivered'
    RETURNING m.id, i.token),
logged AS (
    INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, relay,
        lease_token, outcome, error, receipt, started_at, finished_at)
    SELECT i.id, i.destination, i.attempt, i.downstream_key, $11, i.token,
        CASE WHEN u.id IS NULL THEN 'lease_lost' ELSE i.kind END,
        CASE WHEN u.id IS NULL
            THEN concat_ws(': ', 'the lease was lost before the ' || i.kind || ' outcome was recorded', i.error)
            ELSE i.error END,
        i.receipt, i.started, i.finished
    FROM input i LEFT JOIN delivered d ON d.id = i.id AND d.lease_token = i.token
        LEFT JOIN updated u ON u.id = i.id AND u.token = i.token
    WHERE i.kind <> 'unstarted' AND d.id IS NULL)
SELECT id FROM delivered UNION ALL SELECT id FROM updated
