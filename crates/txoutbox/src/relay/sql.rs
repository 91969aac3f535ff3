//! Every statement of the relay. The literal `status = 'pending'` in [`CLAIM`] matches the partial
//! index `txoutbox_messages_due`; keep it literal.

/// Claims up to $1 due rows under a new lease (owner $2, $3 seconds), skipping rows other relays
/// hold and the rows this relay still holds an attempt of ($4). A row with an ordering key is
/// claimable only when no earlier row of its key is still in the hot table.
///
/// The claim looks at no more than 4 × $1 due rows: those among them that wait behind an earlier
/// row of their ordering key are parked (their `next_attempt_at` moved $5 seconds on, out of the
/// due range; the completion of the row ahead brings the next one back at once), so rows queued
/// behind a blocked head are read once per park, not by every claim. The claim costs the same
/// however many rows wait behind blocked heads.
///
/// Flow control: destinations with a state in `txoutbox_destinations` (paused, a breaker not
/// closed, a rate limit, failures counted) are locked for the statement and bounded: none while
/// paused or open or while a half-open probe is out, one as the probe, no more than the whole
/// tokens of their bucket; destinations $6 are bounded by this relay too ($7 rows at most: its
/// in-flight room, 0 for its own holds). A bounded destination's rows are read apart (at most
/// its bound), so they neither starve nor take the others' place; the tokens its rows took are
/// spent and a probe's lease recorded in the same statement, so every relay shares one budget. A
/// destination none of whose rows were taken is not written: its bucket keeps accruing from its
/// last refill, which gives the same tokens as writing the refill now.
///
/// The UPDATE commits at once: no lock is held while sinks run. `at_most_once` is cleared: it is
/// set again, just before the call, only for an attempt that really starts ([`MARK_STARTED`]).
/// Always returns one row at least: `parked` (rows parked) and `gates` (the bounded destinations'
/// states, as JSON) with NULLs when nothing was claimed.
pub const CLAIM: &str = "WITH flow AS ( \
     SELECT d.destination, d.paused_at, d.breaker, d.open_until, d.probe_until, d.rate_per_sec, \
         d.burst, d.tokens, d.refilled_at, d.failures FROM txoutbox_destinations d \
     WHERE d.paused_at IS NOT NULL OR d.rate_per_sec IS NOT NULL OR d.breaker <> 'closed' \
         OR d.failures > 0 \
     ORDER BY d.destination FOR NO KEY UPDATE), \
 gate AS ( \
     SELECT f.destination, f.rate_per_sec, f.failures, \
         CASE WHEN f.paused_at IS NOT NULL THEN 'paused' \
             WHEN f.breaker = 'open' AND f.open_until > now() THEN 'open' \
             WHEN f.breaker = 'half_open' AND f.probe_until > now() THEN 'probing' \
             WHEN f.breaker <> 'closed' THEN 'probe' \
             ELSE 'closed' END AS state, \
         CASE WHEN f.rate_per_sec IS NULL THEN NULL ELSE least(f.burst, f.tokens + f.rate_per_sec \
             * greatest(EXTRACT(EPOCH FROM now() - f.refilled_at)::float8, 0)) END AS avail, \
         EXTRACT(EPOCH FROM f.open_until - now())::float8 AS open_for \
     FROM flow f), \
 bound AS ( \
     SELECT COALESCE(g.destination, l.destination) AS destination, least( \
         CASE WHEN g.state IN ('paused', 'open', 'probing') THEN 0 \
             WHEN g.state = 'probe' THEN 1 ELSE $1 END, \
         COALESCE(floor(g.avail)::int8, $1), COALESCE(l.room, $1)) AS n \
     FROM (SELECT * FROM gate WHERE state <> 'closed' OR avail IS NOT NULL) g \
     FULL JOIN unnest($6::text[], $7::int8[]) AS l(destination, room) \
         ON l.destination = g.destination), \
 free AS ( \
     SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m \
     WHERE m.status = 'pending' AND m.next_attempt_at <= now() AND m.id <> ALL($4::uuid[]) \
         AND m.destination <> ALL(ARRAY(SELECT destination FROM bound)) \
     ORDER BY m.next_attempt_at \
     LIMIT $1 * 4 \
     FOR UPDATE SKIP LOCKED), \
 bounded AS ( \
     SELECT r.* FROM bound b CROSS JOIN LATERAL ( \
         SELECT m.id, m.ordering_key, m.seq, m.next_attempt_at FROM txoutbox_messages m \
         WHERE m.status = 'pending' AND m.next_attempt_at <= now() \
             AND m.id <> ALL($4::uuid[]) AND m.destination = b.destination \
         ORDER BY m.next_attempt_at \
         LIMIT b.n \
         FOR UPDATE SKIP LOCKED) r \
     WHERE b.n > 0), \
 candidates AS (SELECT * FROM free UNION ALL SELECT * FROM bounded), \
 blocked AS ( \
     SELECT c.id FROM candidates c \
     WHERE c.ordering_key IS NOT NULL AND EXISTS ( \
         SELECT 1 FROM txoutbox_messages p \
         WHERE p.ordering_key = c.ordering_key AND p.seq < c.seq)), \
 parked AS ( \
     UPDATE txoutbox_messages m SET next_attempt_at = now() + make_interval(secs => $5) \
     FROM blocked b WHERE m.id = b.id RETURNING m.id), \
 due AS ( \
     SELECT c.id FROM candidates c WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id) \
     ORDER BY c.next_attempt_at LIMIT $1), \
 claimed AS ( \
     UPDATE txoutbox_messages m SET status = 'in_flight', lease_owner = $2, \
         lease_expires_at = now() + make_interval(secs => $3), \
         lease_token = nextval('txoutbox_lease_token_seq'), attempts = m.attempts + 1, \
         attempt_started_at = now(), at_most_once = false \
     FROM due WHERE m.id = due.id \
     RETURNING m.id, m.destination, m.payload, m.headers, m.downstream_key, m.ordering_key, \
         m.attempts, m.lease_token, m.created_at, m.attempt_started_at), \
 taken AS (SELECT destination, count(*) AS n FROM claimed GROUP BY destination), \
 spent AS ( \
     UPDATE txoutbox_destinations d SET \
         tokens = CASE WHEN g.avail IS NULL THEN d.tokens ELSE g.avail - t.n END, \
         refilled_at = CASE WHEN g.avail IS NULL THEN d.refilled_at ELSE now() END, \
         breaker = CASE WHEN g.state = 'probe' THEN 'half_open' ELSE d.breaker END, \
         probe_until = CASE WHEN g.state = 'probe' \
             THEN now() + make_interval(secs => $3) ELSE d.probe_until END \
     FROM gate g JOIN taken t ON t.destination = g.destination \
     WHERE d.destination = g.destination AND (g.avail IS NOT NULL OR g.state = 'probe')), \
 gates AS ( \
     SELECT json_agg(json_build_object('destination', g.destination, 'state', \
         CASE WHEN g.state = 'probe' AND t.n > 0 THEN 'probing' ELSE g.state END, \
         'tokens', g.avail - COALESCE(t.n, 0), 'rate', g.rate_per_sec, \
         'open_for', g.open_for, 'failures', g.failures))::text AS gates \
     FROM gate g LEFT JOIN taken t ON t.destination = g.destination) \
 SELECT p.parked, gs.gates, c.* FROM (SELECT count(*) AS parked FROM parked) p \
     CROSS JOIN gates gs LEFT JOIN claimed c ON true";

/// Records the rate limits of a relay's destinations (NULL: none) and gives every destination
/// it serves its flow-control row. A relay starting writes its configuration over the last one.
pub const REGISTER_DESTINATIONS: &str = "INSERT INTO txoutbox_destinations AS d \
         (destination, rate_per_sec, burst, tokens) \
     SELECT destination, rate, burst, COALESCE(burst, 0) \
     FROM unnest($1::text[], $2::float8[], $3::float8[]) AS i(destination, rate, burst) \
     ON CONFLICT (destination) DO UPDATE SET rate_per_sec = EXCLUDED.rate_per_sec, \
         burst = EXCLUDED.burst, tokens = least(d.tokens, COALESCE(EXCLUDED.burst, d.tokens)), \
         updated_at = now() \
     WHERE d.rate_per_sec IS DISTINCT FROM EXCLUDED.rate_per_sec \
         OR d.burst IS DISTINCT FROM EXCLUDED.burst";

/// Gives destinations $1 their flow-control row if they have none (before [`LOCK_DESTINATIONS`]).
pub const ENSURE_DESTINATIONS: &str = "INSERT INTO txoutbox_destinations (destination) \
     SELECT unnest($1::text[]) ON CONFLICT (destination) DO NOTHING";

/// Locks the breaker columns of destinations $1 for a feedback write.
pub const LOCK_DESTINATIONS: &str = "SELECT destination, breaker, failures, opens, open_until, \
         open_reason, probe_until, now() AS now \
     FROM txoutbox_destinations WHERE destination = ANY($1::text[]) \
     ORDER BY destination FOR NO KEY UPDATE";

/// Writes the breaker columns computed from a batch's outcomes.
pub const UPDATE_BREAKERS: &str = "UPDATE txoutbox_destinations d SET breaker = u.breaker, \
         failures = u.failures, opens = u.opens, open_until = u.open_until, \
         open_reason = u.open_reason, probe_until = u.probe_until, updated_at = now() \
     FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[], $5::timestamptz[], $6::text[], \
         $7::timestamptz[]) AS u(destination, breaker, failures, opens, open_until, open_reason, \
         probe_until) \
     WHERE d.destination = u.destination";

/// How long a row waiting behind an earlier row of its ordering key is parked by a claim (the
/// completion of the row ahead of it ends the park at once).
pub const ORDERING_PARK_SECS: f64 = 30.0;

/// Commits the start of an at-most-once attempt ($1, under lease token $2) just before its sink
/// is called: from here on a lost outcome makes the row `unknown`, not pending. Returns no row
/// when the lease is no longer ours (then the call is not made).
pub const MARK_STARTED: &str = "UPDATE txoutbox_messages SET at_most_once = true \
     WHERE id = $1 AND lease_token = $2 RETURNING 1";

/// Completes a batch of attempts, fenced by their lease tokens: only rows still leased under the
/// token the attempt ran with change. Delivered rows move to `txoutbox_delivered`; retried rows go
/// back to pending with their next attempt time; dead rows become `failed`; rows given back at
/// shutdown go back to pending at once (`released`: the sink may have been called; `unstarted`:
/// it was not, so the attempt is not counted), or to `unknown` for an at-most-once destination
/// whose call may have reached the downstream. Every attempt is logged, including those whose
/// lease was lost (a completion that came too late), so the log shows every call a downstream
/// received. Inputs are matched to rows by (id, lease token), so two outcomes of one row (an old
/// lease's and a new one's) never collide. The next row of a delivered row's ordering key is
/// unparked.
/// Returns the ids whose completion took effect. A lease token is set only while a row is
/// in flight (claim sets it; completion, reclaim and replay clear it), so matching the token is
/// the whole fence: no `status = 'in_flight'` test, which would steer the planner to the lease
/// index and a nested loop that rescans the batch once per row.
pub const COMPLETE: &str = "WITH input AS ( \
     SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::text[], \
         $6::float8[], $7::timestamptz[], $8::timestamptz[], $9::int4[], $10::text[], \
         $12::text[]) \
         AS i(id, token, kind, error, receipt, delay, started, finished, attempt, downstream_key, \
             destination)), \
 delivered AS ( \
     DELETE FROM txoutbox_messages m \
     WHERE m.id = ANY($1::uuid[]) AND (m.id, m.lease_token) IN ( \
         SELECT i.id, i.token FROM input i WHERE i.kind = 'delivered') \
     RETURNING m.id, m.seq, m.destination, m.payload, m.headers, m.downstream_key, \
         m.ordering_key, m.attempts, m.created_at, m.lease_token), \
 history AS ( \
     INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, downstream_key, \
         ordering_key, attempts, created_at, delivered_at, receipt) \
     SELECT d.id, d.seq, d.destination, d.payload, d.headers, d.downstream_key, \
         d.ordering_key, d.attempts, d.created_at, i.finished, i.receipt \
     FROM delivered d JOIN input i ON i.id = d.id AND i.token = d.lease_token), \
 unparked AS ( \
     UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now()) \
     FROM (SELECT DISTINCT ON (n.ordering_key) n.id FROM txoutbox_messages n \
             JOIN delivered d ON n.ordering_key = d.ordering_key AND n.seq > d.seq \
             ORDER BY n.ordering_key, n.seq) nx \
     WHERE m.id = nx.id AND m.status = 'pending' AND m.id <> ALL($1::uuid[])), \
 updated AS ( \
     UPDATE txoutbox_messages m SET \
         status = CASE WHEN i.kind IN ('failed', 'unknown') THEN i.kind ELSE 'pending' END, \
         next_attempt_at = CASE WHEN i.kind IN ('failed', 'unknown') THEN m.next_attempt_at \
             ELSE now() + make_interval(secs => i.delay) END, \
         attempts = CASE WHEN i.kind = 'unstarted' THEN m.attempts - 1 ELSE m.attempts END, \
         last_error = COALESCE(i.error, m.last_error), \
         lease_owner = NULL, lease_expires_at = NULL, lease_token = NULL \
     FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $6::float8[]) \
         AS i(id, token, kind, error, delay) \
     WHERE m.id = i.id AND m.lease_token = i.token AND i.kind <> 'delivered' \
     RETURNING m.id, i.token), \
 logged AS ( \
     INSERT INTO txoutbox_attempts (message_id, destination, attempt, downstream_key, relay, \
         lease_token, outcome, error, receipt, started_at, finished_at) \
     SELECT i.id, i.destination, i.attempt, i.downstream_key, $11, i.token, \
         CASE WHEN d.id IS NULL AND u.id IS NULL THEN 'lease_lost' ELSE i.kind END, \
         CASE WHEN d.id IS NULL AND u.id IS NULL \
             THEN concat_ws(': ', 'the lease was lost before the ' || i.kind || ' outcome was recorded', i.error) \
             ELSE i.error END, \
         i.receipt, i.started, i.finished \
     FROM input i LEFT JOIN delivered d ON d.id = i.id AND d.lease_token = i.token \
         LEFT JOIN updated u ON u.id = i.id AND u.token = i.token \
     WHERE i.kind <> 'unstarted') \
 SELECT id FROM delivered UNION ALL SELECT id FROM updated";

/// At shutdown, gives back every row this relay ($1) still holds whose sink was never called
/// (not one of $2, the rows whose call started): pending again at once, the attempt not counted.
/// It catches what a claim cut short by the shutdown committed after the relay stopped waiting.
pub const RELEASE_UNSTARTED: &str = "UPDATE txoutbox_messages SET status = 'pending', \
     attempts = greatest(attempts - 1, 0), lease_owner = NULL, lease_expires_at = NULL, \
     lease_token = NULL, at_most_once = false \
     WHERE status = 'in_flight' AND lease_owner = $1 AND id <> ALL($2::uuid[]) RETURNING id";

/// Takes back rows whose lease expired (their relay died, paused or lost the network): pending
/// again with the same key, or `unknown` for at-most-once destinations, where the attempt may
/// have reached the downstream and must not be repeated blindly. At most $1 rows per call.
pub const RECLAIM_EXPIRED: &str = "WITH expired AS ( \
     SELECT id, destination, lease_owner, lease_token, attempts, downstream_key, \
         attempt_started_at, at_most_once FROM txoutbox_messages \
     WHERE status = 'in_flight' AND lease_expires_at < now() \
     ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED), \
 moved AS ( \
     UPDATE txoutbox_messages m SET \
         status = CASE WHEN e.at_most_once THEN 'unknown' ELSE 'pending' END, \
         next_attempt_at = now(), \
         last_error = 'the lease of relay ' || e.lease_owner || ' expired during attempt ' \
             || e.attempts || CASE WHEN e.at_most_once \
                 THEN ' (at-most-once destination: not retried; replay it if it did not happen)' \
                 ELSE '' END, \
         lease_owner = NULL, lease_expires_at = NULL, lease_token = NULL \
     FROM expired e WHERE m.id = e.id \
     RETURNING m.id, m.last_error, m.status), \
 logged AS ( \
     INSERT INTO txoutbox_attempts (message_id, destination, attempt, downstream_key, relay, \
         lease_token, outcome, error, started_at) \
     SELECT e.id, e.destination, e.attempts, e.downstream_key, e.lease_owner, e.lease_token, \
         CASE WHEN mv.status = 'unknown' THEN 'unknown' ELSE 'expired' END, mv.last_error, \
         COALESCE(e.attempt_started_at, now()) \
     FROM expired e JOIN moved mv ON mv.id = e.id) \
 SELECT count(*) FROM moved";

/// The channel the write path's hint arrives on.
pub const LISTEN: &str = concat!("LISTEN ", wake_channel!());

/// The backlog gauges: pending rows, and how long the longest-waiting due row has been due. Both
/// read only the partial index `txoutbox_messages_due` (the literal `'pending'` selects it): a
/// count over it, and its first entry.
pub const SAMPLE_BACKLOG: &str = "SELECT \
     (SELECT count(*) FROM txoutbox_messages WHERE status = 'pending'), \
     COALESCE((SELECT EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8 \
         FROM txoutbox_messages WHERE status = 'pending' AND next_attempt_at <= now()), 0)::float8";
