-- Claims up to $1 due rows under a new lease (owner $2, $3 seconds), skipping rows other relays
-- hold and the rows this relay still holds an attempt of ($4). A row with an ordering key is
-- claimable only when no earlier row of its key is still in the hot table.
--
-- A row enqueued behind an earlier row of its key is written waiting (`messages/insert.sql`:
-- `next_attempt_at` 9999-12-31), out of the due range: the claim never reads it. What follows
-- about rows waiting behind a blocked head is for rows due anyway (written before rows were
-- written waiting, or by another program).
--
-- The claim locks the first $1 due rows (those of other relays skipped) and no more: every row
-- it locks and does not take costs a lock record, and the next claim locks it again. When some
-- of them wait behind an earlier row of their ordering key, the claim takes the others and
-- parks the key's whole due queue from there on, in one index range of
-- `txoutbox_messages_ordering` (at most 10 000 rows a claim): their `next_attempt_at` moves $5
-- seconds on, $8 when the key's head is dead, out of the due range; the completion of the row
-- ahead brings the next one back at once. The relay claims again at once after a claim that
-- parked rows, so the rows it could not take are replaced by the next claim's rather than
-- looked for by over-reading every claim. So rows queued behind a blocked head are read once
-- per park, not by every claim, and one claim clears the queue behind a dead head instead of
-- one claim per $1 rows of it before the other keys' rows are reached. The claim costs the same
-- however many rows wait behind blocked heads.
--
-- Flow control: destinations with a state in `txoutbox_destinations` (paused, throttled, a
-- breaker not closed, a rate limit, failures counted) are locked for the statement and bounded:
-- none while paused, throttled or open or while a half-open probe is out, one as the probe, no
-- more than the whole tokens of their bucket; destinations $6 are bounded by this relay too ($7
-- rows at most: its in-flight room, its ramp after a pause, 0 for its own holds). A bounded destination's rows are read apart (at most
-- its bound), so they neither starve nor take the others' place; the tokens its rows took are
-- spent and a probe's lease recorded in the same statement, so every relay shares one budget. A
-- destination none of whose rows were taken is not written: its bucket keeps accruing from its
-- last refill, which gives the same tokens as writing the refill now.
--
-- A half-open breaker's probe is a row never tried when one is due (the oldest due row else; each
-- skips rows locked elsewhere, so a row another transaction holds never stops the probing): a
-- row that failed before says more about itself than about the downstream, and the rows due
-- the longest behind an open breaker are the very ones whose failures opened it, so probing
-- them first would keep a healthy destination shut, each failed probe doubling the cool-down.
--
-- The UPDATE commits at once: no lock is held while sinks run. `at_most_once` is cleared: it is
-- set again, just before the call, only for an attempt that really starts (`messages/mark_started.sql`).
-- Always returns one row at least: `parked` (rows parked), `parked_ids` (the first row parked of
-- each key: the only one `messages/unpark_freed.sql` can find free, every other has it ahead)
-- and `gates` (the bounded destinations' states, as JSON) with NULLs when nothing was claimed.
-- `free` compares `destination || ''`, not the column: the planner estimates the column's
-- `<> ALL(unknown array)` from its statistics, and with few destinations it expects almost no
-- row to pass, so it sorts the whole hot table instead of reading the due index in order
-- (O(backlog) per claim). The expression has no statistics, gets the default estimate, and the
-- claim reads only the first due entries of the index. `claimed` takes its rows by
-- `id = ANY(ARRAY(…))`, `blocked` looks up the row ahead by a LATERAL with LIMIT 1, and `queued`
-- reads each blocked key's range of `txoutbox_messages_ordering`: index lookups in every plan.
-- `parked` takes the queued rows by `ctid = ANY(ARRAY(…))`, a TID scan in every plan (by id, the
-- primary key was searched once per id: 200 ms for 100 000 rows). The planner cannot know how
-- many rows the bounded destinations' branch yields and guesses millions; joined to those
-- guesses, the claim hashed the whole hot table (twice, once per join) on every claim that met
-- rows behind a failed head (150 ms at 220 000 rows, 26 ms after), and the generic plan of the
-- prepared statement did so on every claim.
--
-- The end of the statement, from `blocked` to the UPDATE of `claimed`, is
-- `parts/claim_end.sql`, the same in `messages/claim.sql` and `messages/claim_unbounded.sql`:
-- from the `candidates` (due rows, locked), the rows waiting behind an earlier row of their
-- ordering key are found (`blocked`), their keys' due queues from the first of them on are locked
-- (`queued`, skipping rows locked elsewhere) and parked, and up to $1 of the other candidates
-- claimed under a new lease.
--
-- Parameters:
-- $1 limit: int8
-- $2 owner: text
-- $3 lease_secs: float8
-- $4 held: uuid[]
-- $5 ordering_park_secs: float8
-- $6 bounded: text[]
-- $7 room: int8[]
-- $8 dead_head_park_secs: float8
WITH flow AS (
    SELECT d.destination, d.paused_at, d.breaker, d.open_until, d.probe_until, d.rate_per_sec,
        d.burst, d.tokens, d.refilled_at, d.failures, d.throttled_until
    FROM txoutbox_destinations d
    WHERE d.paused_at IS NOT NULL OR d.rate_per_sec IS NOT NULL OR d.breaker <> 'closed'
        OR d.failures > 0 OR d.throttled_until > now()
    ORDER BY d.destination FOR NO KEY UPDATE),
gate AS (
    SELECT f.destination, f.rate_per_sec, f.failures,
        CASE WHEN f.paused_at IS NOT NULL THEN 'paused'
            WHEN f.throttled_until > now() THEN 'throttled'
            WHEN f.breaker = 'open' AND f.open_until > now() THEN 'open'
            WHEN f.breaker = 'half_open' AND f.probe_until > now() THEN 'probing'
            WHEN f.breaker <> 'closed' THEN 'probe'
            ELSE 'closed' END AS state,
        CASE WHEN f.rate_per_sec IS NULL THEN NULL ELSE least(f.burst, f.tokens + f.rate_per_sec
            * greatest(EXTRACT(EPOCH FROM now() - f.refilled_at)::float8, 0)) END AS avail,
        EXTRACT(EPOCH FROM CASE WHEN f.throttled_until > now() THEN f.throttled_until
            ELSE f.open_until END - now())::float8 AS open_for
    FROM flow f),
bound AS (
    SELECT COALESCE(g.destination, l.destination) AS destination,
        COALESCE(g.state = 'probe', false) AS probe, least(
        CASE WHEN g.state IN ('paused', 'throttled', 'open', 'probing') THEN 0
            WHEN g.state = 'probe' THEN 1 ELSE $1 END,
        COALESCE(floor(g.avail)::int8, $1), COALESCE(l.room, $1)) AS n
    FROM (SELECT * FROM gate WHERE state <> 'closed' OR avail IS NOT NULL) g
    FULL JOIN unnest($6::text[], $7::int8[]) AS l(destination, room)
        ON l.destination = g.destination),
free AS (
    SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m
    WHERE m.status = 'pending' AND m.next_attempt_at <= now() AND m.id <> ALL($4::uuid[])
        AND (m.destination || '') <> ALL(ARRAY(SELECT destination FROM bound))
    ORDER BY m.next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED),
bounded AS (
    SELECT r.* FROM bound b CROSS JOIN LATERAL (
        SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m
        WHERE m.status = 'pending' AND m.next_attempt_at <= now()
            AND m.id <> ALL($4::uuid[]) AND m.destination = b.destination
        ORDER BY m.next_attempt_at
        LIMIT b.n
        FOR UPDATE SKIP LOCKED) r
    WHERE b.n > 0 AND NOT b.probe
    UNION ALL
    SELECT r.id, r.ordering_key, r.seq, r.next_attempt_at FROM bound b CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT * FROM (
                SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at, 0 AS tried
                FROM txoutbox_messages m
                WHERE m.status = 'pending' AND m.next_attempt_at <= now()
                    AND m.id <> ALL($4::uuid[]) AND m.destination = b.destination
                    AND m.attempts = 0
                ORDER BY m.next_attempt_at LIMIT 1
                FOR UPDATE SKIP LOCKED) fresh
            UNION ALL
            SELECT * FROM (
                SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at, 1 AS tried
                FROM txoutbox_messages m
                WHERE m.status = 'pending' AND m.next_attempt_at <= now()
                    AND m.id <> ALL($4::uuid[]) AND m.destination = b.destination
                ORDER BY m.next_attempt_at LIMIT 1
                FOR UPDATE SKIP LOCKED) oldest) p
        ORDER BY p.tried LIMIT 1) r
    WHERE b.n > 0 AND b.probe),
candidates AS (SELECT * FROM free UNION ALL SELECT * FROM bounded),
\i messages/parts/claim_end.sql
    RETURNING m.id, m.destination, m.payload::text AS payload, m.headers::text AS headers,
        m.downstream_key, m.ordering_key, m.attempts, m.lease_token, m.created_at,
        m.attempt_started_at),
taken AS (SELECT destination, count(*) AS n FROM claimed GROUP BY destination),
spent AS (
    UPDATE txoutbox_destinations d SET
        tokens = CASE WHEN g.avail IS NULL THEN d.tokens ELSE g.avail - t.n END,
        refilled_at = CASE WHEN g.avail IS NULL THEN d.refilled_at ELSE now() END,
        breaker = CASE WHEN g.state = 'probe' THEN 'half_open' ELSE d.breaker END,
        probe_until = CASE WHEN g.state = 'probe'
            THEN now() + make_interval(secs => $3) ELSE d.probe_until END
    FROM gate g JOIN taken t ON t.destination = g.destination
    WHERE d.destination = g.destination AND (g.avail IS NOT NULL OR g.state = 'probe')),
gates AS (
    SELECT json_agg(json_build_object('destination', g.destination, 'state',
        CASE WHEN g.state = 'probe' AND t.n > 0 THEN 'probing' ELSE g.state END,
        'tokens', g.avail - COALESCE(t.n, 0), 'rate', g.rate_per_sec,
        'open_for', g.open_for, 'failures', g.failures))::text AS gates
    FROM gate g LEFT JOIN taken t ON t.destination = g.destination)
SELECT p.parked, CASE WHEN row_number() OVER () = 1 THEN p.parked_ids END AS parked_ids,
    gs.gates, c.* FROM (SELECT (SELECT count(*) FROM parked) AS parked, ARRAY(
        SELECT DISTINCT ON (f.ordering_key) f.id FROM parked f
        ORDER BY f.ordering_key, f.seq) AS parked_ids) p
    CROSS JOIN gates gs LEFT JOIN claimed c ON true
