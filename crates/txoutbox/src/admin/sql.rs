//! Every statement of the operator's tools. Hot rows (`pending`, `in_flight`, `failed`,
//! `unknown`) are in `txoutbox_messages`; `delivered` rows in `txoutbox_delivered`, where the
//! relay's completion statement moved them.
//!
//! A filter binds the same parameters everywhere ($2..$8: destination, since (timestamp, seconds
//! ago), until (timestamp, seconds ago), downstream key, ordering key; $10, $11: error text
//! contained, normalised error text; $12, $13: the keyset cursor, (created_at, seq) before which
//! a page starts), so one macro holds its text. Times are compared with `created_at` (enqueue time); relative bounds use the
//! database's clock, the one that wrote `created_at`.

/// The columns of a destination's flow-control state (see [`FLOW_STATE`]).
macro_rules! flow_state {
    () => {
        "SELECT destination, \
             CASE WHEN paused_at IS NOT NULL THEN 'paused' \
                 WHEN breaker = 'open' AND open_until > now() THEN 'open' \
                 WHEN breaker <> 'closed' THEN 'half_open' ELSE 'closed' END AS state, \
             paused_at, paused_by, paused_reason, rate_per_sec, \
             CASE WHEN rate_per_sec IS NULL THEN NULL ELSE least(burst, tokens + rate_per_sec \
                 * greatest(EXTRACT(EPOCH FROM now() - refilled_at)::float8, 0)) END AS tokens, \
             failures, open_until, open_reason \
         FROM txoutbox_destinations"
    };
}

/// A failure's text with what varies between two failures of one cause replaced: UUIDs by
/// `<uuid>`, then runs of digits by `<n>` (ids, amounts, timestamps, ports), cut to 300
/// characters. Failures with the same normalised text form one group of `failures`.
macro_rules! normalised_error {
    ($text:literal) => {
        concat!(
            "left(regexp_replace(regexp_replace(",
            $text,
            ", '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', \
             '<uuid>', 'g'), '[0-9]+', '<n>', 'g'), 300)"
        )
    };
}

/// The WHERE conditions of a message filter, over a table aliased `t`: `hot` for
/// `txoutbox_messages`, `delivered` for `txoutbox_delivered` (which keeps no error text, so a
/// filter on the error selects none of its rows).
macro_rules! filter {
    (hot) => {
        concat!(
            filter!(common),
            " AND ($10::text IS NULL OR strpos(lower(t.last_error), lower($10)) > 0) \
             AND ($11::text IS NULL OR COALESCE(",
            normalised_error!("t.last_error"),
            ", '') = $11)"
        )
    };
    (delivered) => {
        concat!(
            filter!(common),
            " AND $10::text IS NULL AND $11::text IS NULL"
        )
    };
    (common) => {
        "($2::text IS NULL OR t.destination = $2) \
         AND ($3::timestamptz IS NULL OR t.created_at >= $3) \
         AND ($4::float8 IS NULL OR t.created_at >= now() - make_interval(secs => $4)) \
         AND ($5::timestamptz IS NULL OR t.created_at < $5) \
         AND ($6::float8 IS NULL OR t.created_at < now() - make_interval(secs => $6)) \
         AND ($7::text IS NULL OR t.downstream_key = $7) \
         AND ($8::text IS NULL OR t.ordering_key = $8) \
         AND ($12::timestamptz IS NULL OR (t.created_at, t.seq) < ($12, $13::int8))"
    };
}

/// Lists messages of status $1 (NULL: any, `delivered` and `discarded` included) matching the
/// filter, newest first (keyset order: (created_at, seq) descending), at most $9 (NULL: all).
/// Each table is ordered and limited on its own before the merge: a branch with conditions is not
/// merged in order otherwise, so the (created_at, seq) index of the delivered history could not
/// serve a page; a page costs the same however large the history is.
pub const LIST: &str = concat!(
    "SELECT * FROM (( \
     SELECT t.id, t.seq, t.destination, t.status, t.downstream_key, t.ordering_key, t.attempts, \
         t.created_at, t.next_attempt_at, NULL::timestamptz AS delivered_at, t.last_error, \
         t.lease_owner, t.lease_expires_at, NULL::timestamptz AS discarded_at \
     FROM txoutbox_messages t WHERE ($1::text IS NULL OR t.status = $1) AND ",
    filter!(hot),
    " ORDER BY t.created_at DESC, t.seq DESC LIMIT $9) \
     UNION ALL ( \
     SELECT t.id, t.seq, t.destination, 'delivered', t.downstream_key, t.ordering_key, \
         t.attempts, t.created_at, NULL, t.delivered_at, NULL, NULL, NULL, NULL \
     FROM txoutbox_delivered t WHERE ($1::text IS NULL OR $1 = 'delivered') AND ",
    filter!(delivered),
    " ORDER BY t.created_at DESC, t.seq DESC LIMIT $9) \
     UNION ALL ( \
     SELECT t.id, t.seq, t.destination, 'discarded', t.downstream_key, t.ordering_key, \
         t.attempts, t.created_at, NULL, NULL, t.last_error, NULL, NULL, t.discarded_at \
     FROM txoutbox_discarded t WHERE ($1::text IS NULL OR $1 = 'discarded') AND ",
    filter!(hot),
    " ORDER BY t.created_at DESC, t.seq DESC LIMIT $9)) r \
     ORDER BY created_at DESC, seq DESC LIMIT $9"
);

/// One message, from whichever table holds it.
pub const SHOW: &str = "SELECT id, seq, destination, status, downstream_key, ordering_key, \
         attempts, created_at, next_attempt_at, NULL::timestamptz AS delivered_at, last_error, \
         lease_owner, lease_expires_at, NULL::timestamptz AS discarded_at, payload, headers, \
         NULL::text AS receipt \
     FROM txoutbox_messages WHERE id = $1 \
     UNION ALL \
     SELECT id, seq, destination, 'delivered', downstream_key, ordering_key, attempts, \
         created_at, NULL, delivered_at, NULL, NULL, NULL, NULL, payload, headers, receipt \
     FROM txoutbox_delivered WHERE id = $1 \
     UNION ALL \
     SELECT id, seq, destination, 'discarded', downstream_key, ordering_key, attempts, \
         created_at, NULL, NULL, last_error, NULL, NULL, discarded_at, payload, headers, NULL \
     FROM txoutbox_discarded WHERE id = $1";

/// True when $1 was discarded (a replay by id names it: refused with the reason).
pub const IS_DISCARDED: &str = "SELECT EXISTS (SELECT 1 FROM txoutbox_discarded WHERE id = $1)";

/// The ids a discard by filter selects: hot rows of the statuses $1 matching the filter, in
/// insertion order, at most $9 (NULL: all). Taken without locks: each batch locks and checks its
/// rows again.
pub const DISCARD_SELECT: &str = concat!(
    "SELECT t.id FROM txoutbox_messages t WHERE t.status = ANY($1::text[]) AND ",
    filter!(hot),
    " ORDER BY t.seq LIMIT $9"
);

/// Discards the hot rows $1 (locked and checked `failed` or `unknown` by the caller) with the
/// operator's reason $2: moves them to `txoutbox_discarded`, logs one operator action per row
/// (attempt 0, relay `operator`, outcome `discarded`, the text $3: the reason, and who gave it when
/// known), and ends the park
/// of the next pending row of each one's ordering key (the claim parks rows behind a head for
/// 30 s; the head is gone, so the next row is due at once). Returns the ids discarded.
pub const DISCARD: &str = "WITH gone AS ( \
     DELETE FROM txoutbox_messages m WHERE m.id = ANY($1::uuid[]) \
         AND m.status IN ('failed', 'unknown') \
     RETURNING m.id, m.seq, m.destination, m.payload, m.headers, m.downstream_key, \
         m.ordering_key, m.attempts, m.status, m.last_error, m.created_at), \
 kept AS ( \
     INSERT INTO txoutbox_discarded (id, seq, destination, payload, headers, downstream_key, \
         ordering_key, attempts, discarded_from, last_error, reason, created_at) \
     SELECT id, seq, destination, payload, headers, downstream_key, ordering_key, attempts, \
         status, last_error, $2, created_at FROM gone RETURNING id), \
 logged AS ( \
     INSERT INTO txoutbox_attempts (message_id, destination, attempt, downstream_key, relay, \
         outcome, error, started_at, finished_at) \
     SELECT id, destination, 0, downstream_key, 'operator', 'discarded', $3, now(), now() \
     FROM gone), \
 unparked AS ( \
     UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now()) \
     FROM (SELECT DISTINCT ON (n.ordering_key) n.id FROM txoutbox_messages n \
             JOIN gone g ON n.ordering_key = g.ordering_key AND n.seq > g.seq \
             WHERE n.id <> ALL($1::uuid[]) \
             ORDER BY n.ordering_key, n.seq) nx \
     WHERE m.id = nx.id AND m.status = 'pending') \
 SELECT id FROM kept";

/// A message's attempt log (relay attempts and operator actions), in the order they happened.
pub const HISTORY: &str = "SELECT attempt, downstream_key, relay, lease_token, outcome, error, \
         receipt, started_at, finished_at \
     FROM txoutbox_attempts WHERE message_id = $1 \
     ORDER BY started_at, finished_at, attempt";

/// The ids a replay by filter selects: hot rows of the statuses $1, then delivered rows when $1
/// holds `delivered`, each in insertion order; at most $9 (NULL: all). Taken without locks: each
/// batch locks and checks its rows again.
pub const REPLAY_SELECT: &str = concat!(
    "SELECT id FROM ( \
     SELECT t.id, 0 AS place, t.seq FROM txoutbox_messages t \
     WHERE t.status = ANY($1::text[]) AND ",
    filter!(hot),
    " UNION ALL \
     SELECT t.id, 1, t.seq FROM txoutbox_delivered t \
     WHERE 'delivered' = ANY($1::text[]) AND ",
    filter!(delivered),
    ") s ORDER BY place, seq LIMIT $9"
);

/// Bounds every lock wait of a replay transaction: a row locked for long is an error, not a hang.
pub const LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', '5s', true)";

/// Locks the hot rows among $1 (in id order, so two operators cannot deadlock). A relay's claim
/// skips locked rows and its completion waits for them, so nothing changes them until commit.
pub const LOCK_HOT: &str = "SELECT id, status, destination, downstream_key, ordering_key, \
         lease_owner, lease_expires_at, COALESCE(lease_expires_at > now(), false) \
     FROM txoutbox_messages WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE";

/// [`LOCK_HOT`] without the locks, for a dry run.
pub const READ_HOT: &str = "SELECT id, status, destination, downstream_key, ordering_key, \
         lease_owner, lease_expires_at, COALESCE(lease_expires_at > now(), false) \
     FROM txoutbox_messages WHERE id = ANY($1::uuid[]) ORDER BY id";

/// Locks the delivered rows among $1 (the pruner skips locked rows).
pub const LOCK_DELIVERED: &str = "SELECT id, destination, downstream_key, ordering_key \
     FROM txoutbox_delivered WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE";

/// [`LOCK_DELIVERED`] without the locks, for a dry run.
pub const READ_DELIVERED: &str = "SELECT id, destination, downstream_key, ordering_key \
     FROM txoutbox_delivered WHERE id = ANY($1::uuid[]) ORDER BY id";

/// The hot rows that already carry a (destination, downstream key) of delivered rows about to be
/// moved back (the same effect enqueued again after its delivery): pairs (delivered id, hot id).
pub const KEY_TAKEN: &str = "SELECT i.id, m.id \
     FROM unnest($1::uuid[], $2::text[], $3::text[]) AS i(id, destination, downstream_key) \
     JOIN txoutbox_messages m ON m.destination = i.destination \
         AND m.downstream_key = i.downstream_key AND m.id <> i.id";

/// Puts hot rows $1 back to pending with downstream keys $2: due now, a fresh attempt budget, no
/// lease (a late completion of an old lease is fenced off by the cleared token), no last error.
pub const REPLAY_HOT: &str = "UPDATE txoutbox_messages m SET status = 'pending', \
         next_attempt_at = now(), attempts = 0, lease_owner = NULL, lease_expires_at = NULL, \
         lease_token = NULL, attempt_started_at = NULL, at_most_once = false, last_error = NULL, \
         downstream_key = i.downstream_key \
     FROM unnest($1::uuid[], $2::text[]) AS i(id, downstream_key) \
     WHERE m.id = i.id RETURNING m.id";

/// Moves delivered rows $1 back into the hot table as pending, with downstream keys $2. They get
/// a new `seq`: a redelivery queues behind the rows of its ordering key that wait now.
pub const MOVE_DELIVERED: &str = "WITH moved AS ( \
     DELETE FROM txoutbox_delivered d \
     USING unnest($1::uuid[], $2::text[]) AS i(id, downstream_key) \
     WHERE d.id = i.id \
     RETURNING d.id, d.seq, d.destination, d.payload, d.headers, i.downstream_key, \
         d.ordering_key, d.created_at) \
 INSERT INTO txoutbox_messages (id, destination, payload, headers, downstream_key, \
     ordering_key, status, attempts, next_attempt_at, created_at) \
 SELECT id, destination, payload, headers, downstream_key, ordering_key, 'pending', 0, now(), \
     created_at FROM moved ORDER BY seq \
 RETURNING id";

/// Logs one operator replay per row: attempt 0, relay `operator`, outcome `replayed`, the key the
/// row carries from now on, and a note ($3) saying what changed.
pub const LOG_REPLAYS: &str = "INSERT INTO txoutbox_attempts (message_id, attempt, \
         downstream_key, relay, outcome, error, started_at, finished_at) \
     SELECT i.id, 0, i.downstream_key, 'operator', 'replayed', i.note, now(), now() \
     FROM unnest($1::uuid[], $2::text[], $3::text[]) AS i(id, downstream_key, note)";

/// The relays' wake-up channel (a replay is rare: the hint in the transaction costs nothing).
pub const NOTIFY: &str = concat!("SELECT pg_notify('", wake_channel!(), "', '')");

/// The purge's cutoff, fixed once so that every batch and the dry run agree.
pub const PURGE_CUTOFF: &str = "SELECT now() - make_interval(secs => $1)";

/// What a purge would delete, with the cutoffs $1 (delivered), $2 (failed), $3 (unknown), $4
/// (discarded): the rows past their state's retention, their attempt-log rows, attempt-log rows
/// older than the delivered cutoff whose message is gone, expired keys. A failed or unknown row's
/// age is that of its last attempt-log entry (a replay starts it again), else its enqueue time.
pub const PURGE_COUNTS: &str = "WITH hot AS ( \
     SELECT m.id, m.status FROM txoutbox_messages m \
     WHERE (m.status = 'failed' AND m.created_at < $2 AND NOT EXISTS ( \
             SELECT 1 FROM txoutbox_attempts a WHERE a.message_id = m.id AND a.finished_at >= $2)) \
        OR (m.status = 'unknown' AND m.created_at < $3 AND NOT EXISTS ( \
             SELECT 1 FROM txoutbox_attempts a WHERE a.message_id = m.id AND a.finished_at >= $3))), \
 doomed AS ( \
     SELECT id FROM txoutbox_delivered WHERE delivered_at < $1 \
     UNION ALL SELECT id FROM hot \
     UNION ALL SELECT id FROM txoutbox_discarded WHERE discarded_at < $4) \
 SELECT \
     (SELECT count(*) FROM txoutbox_delivered WHERE delivered_at < $1), \
     (SELECT count(*) FROM hot WHERE status = 'failed'), \
     (SELECT count(*) FROM hot WHERE status = 'unknown'), \
     (SELECT count(*) FROM txoutbox_discarded WHERE discarded_at < $4), \
     (SELECT count(*) FROM txoutbox_attempts a WHERE a.message_id IN (SELECT id FROM doomed)), \
     (SELECT count(*) FROM txoutbox_attempts a WHERE a.finished_at < $1 \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_messages m WHERE m.id = a.message_id) \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_delivered d WHERE d.id = a.message_id) \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_discarded x WHERE x.id = a.message_id)), \
     (SELECT count(*) FROM txoutbox_idempotency_keys WHERE expires_at <= now())";

/// Deletes one batch ($2) of rows delivered before $1, oldest first, with their attempt-log rows,
/// in one statement (its own transaction). Rows a replay holds are skipped, not waited for.
pub const PURGE_DELIVERED_BATCH: &str = "WITH doomed AS ( \
     SELECT id FROM txoutbox_delivered WHERE delivered_at < $1 \
     ORDER BY delivered_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
 gone AS ( \
     DELETE FROM txoutbox_delivered d USING doomed WHERE d.id = doomed.id RETURNING d.id), \
 logs AS ( \
     DELETE FROM txoutbox_attempts a USING gone WHERE a.message_id = gone.id RETURNING 1) \
 SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM logs)";

/// Deletes one batch ($2) of rows discarded before $1, oldest first, with their attempt-log rows.
pub const PURGE_DISCARDED_BATCH: &str = "WITH doomed AS ( \
     SELECT id FROM txoutbox_discarded WHERE discarded_at < $1 \
     ORDER BY discarded_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
 gone AS ( \
     DELETE FROM txoutbox_discarded d USING doomed WHERE d.id = doomed.id RETURNING d.id), \
 logs AS ( \
     DELETE FROM txoutbox_attempts a USING gone WHERE a.message_id = gone.id RETURNING 1) \
 SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM logs)";

/// Deletes one batch ($3) of hot rows of status $1 (`failed` or `unknown`) whose last activity is
/// older than $2, with their attempt-log rows, and ends the park of the next pending row of each
/// one's ordering key (the row ahead of it is gone: it is due at once). Rows a relay or an
/// operator holds are skipped.
pub const PURGE_HOT_BATCH: &str = "WITH doomed AS ( \
     SELECT m.id FROM txoutbox_messages m \
     WHERE m.status = $1 AND m.created_at < $2 AND NOT EXISTS ( \
         SELECT 1 FROM txoutbox_attempts a WHERE a.message_id = m.id AND a.finished_at >= $2) \
     ORDER BY m.seq LIMIT $3 FOR UPDATE SKIP LOCKED), \
 gone AS ( \
     DELETE FROM txoutbox_messages m USING doomed WHERE m.id = doomed.id AND m.status = $1 \
     RETURNING m.id, m.seq, m.ordering_key), \
 logs AS ( \
     DELETE FROM txoutbox_attempts a USING gone WHERE a.message_id = gone.id RETURNING 1), \
 unparked AS ( \
     UPDATE txoutbox_messages m SET next_attempt_at = LEAST(m.next_attempt_at, now()) \
     FROM (SELECT DISTINCT ON (n.ordering_key) n.id FROM txoutbox_messages n \
             JOIN gone g ON n.ordering_key = g.ordering_key AND n.seq > g.seq \
             WHERE NOT EXISTS (SELECT 1 FROM doomed x WHERE x.id = n.id) \
             ORDER BY n.ordering_key, n.seq) nx \
     WHERE m.id = nx.id AND m.status = 'pending') \
 SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM logs)";

/// Deletes one batch ($2) of attempt-log rows older than $1 whose message is in no table
/// (purged before, or deleted by hand).
pub const PURGE_ORPHAN_ATTEMPTS_BATCH: &str =
    "DELETE FROM txoutbox_attempts WHERE ctid = ANY(ARRAY( \
     SELECT a.ctid FROM txoutbox_attempts a WHERE a.finished_at < $1 \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_messages m WHERE m.id = a.message_id) \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_delivered d WHERE d.id = a.message_id) \
         AND NOT EXISTS (SELECT 1 FROM txoutbox_discarded x WHERE x.id = a.message_id) \
     LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING 1";

/// Hot rows by destination and status, with the age in seconds of each group's oldest row (used
/// for `pending`), counted exactly but reading at most $1 rows: when the counts add up to $1, the
/// backlog is larger and [`STATS_HOT_SAMPLE`] answers instead. The delivered history is counted
/// by [`STATS_DELIVERED_EXACT`] or [`STATS_DELIVERED_ESTIMATE`], never by a scan.
pub const STATS_COUNTS: &str = "SELECT destination, status, count(*), \
         EXTRACT(EPOCH FROM now() - min(created_at))::float8 \
     FROM (SELECT destination, status, created_at FROM txoutbox_messages LIMIT $1) h \
     GROUP BY destination, status";

/// Discarded rows by destination (a small table: rows leave it only by the operator's hand).
pub const STATS_DISCARDED: &str = "SELECT destination, 'discarded', count(*), NULL::float8 \
     FROM txoutbox_discarded GROUP BY destination";

/// A backlog too large to count at each look: its pending rows from a sample of $1 percent of
/// the hot table's pages, scaled by 100 / $1, by destination, with the oldest row of each in the
/// sample. The same pages each time (a fixed seed): they stay cached, and a refreshed page does
/// not jump between two samples' figures.
pub const STATS_HOT_SAMPLE: &str = "SELECT destination, status, \
         round(count(*) * 100.0 / $1)::int8, EXTRACT(EPOCH FROM now() - min(created_at))::float8 \
     FROM txoutbox_messages TABLESAMPLE SYSTEM ($1) REPEATABLE (0) \
     WHERE status = 'pending' GROUP BY destination, status";

/// The rows a large backlog still counts exactly, through their small partial indexes: in flight
/// (`txoutbox_messages_lease`), failed and unknown (`txoutbox_messages_dead`).
pub const STATS_HOT_FEW: &str = "SELECT destination, status, count(*), NULL::float8 \
     FROM txoutbox_messages WHERE status = 'in_flight' GROUP BY destination, status \
     UNION ALL \
     SELECT destination, status, count(*), NULL::float8 \
     FROM txoutbox_messages WHERE status IN ('failed', 'unknown') GROUP BY destination, status";

/// How long ago the oldest pending row was enqueued, exactly: the first pending entry of the
/// `(created_at, seq)` index.
pub const STATS_OLDEST_PENDING: &str =
    "SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float8 \
     FROM txoutbox_messages WHERE status = 'pending'";

/// The hot table's size as the planner last saw it (`pg_class.reltuples`; -1: never analysed).
pub const STATS_HOT_TUPLES: &str =
    "SELECT reltuples::float8 FROM pg_class WHERE oid = 'txoutbox_messages'::regclass";

/// Delivered rows by destination, counted exactly but reading at most $1 entries of the index
/// `txoutbox_delivered_key`: when the counts add up to $1, the history is larger and
/// [`STATS_DELIVERED_ESTIMATE`] answers instead.
pub const STATS_DELIVERED_EXACT: &str = "SELECT destination, count(*) FROM ( \
     SELECT destination FROM txoutbox_delivered ORDER BY destination, downstream_key LIMIT $1) d \
     GROUP BY destination";

/// The planner's estimate of the delivered history: its row count (`pg_class.reltuples`, -1 when
/// never analysed) and the most common destinations with their frequencies (`pg_stats`), as
/// ANALYZE (autovacuum) last sampled them. Reads the catalogue only.
pub const STATS_DELIVERED_ESTIMATE: &str = "SELECT c.reltuples::float8, \
         s.most_common_vals::text::text[], s.most_common_freqs::float8[] \
     FROM pg_class c \
     LEFT JOIN pg_stats s ON s.schemaname = c.relnamespace::regnamespace::text \
         AND s.tablename = c.relname AND s.attname = 'destination' \
     WHERE c.oid = 'txoutbox_delivered'::regclass";

/// Relay attempts that finished in the last $1 seconds, by destination: all of them, and those
/// that failed (`retry`, `failed`, `expired`, `unknown`). Operator actions, leases given back at
/// shutdown and outcomes that came after the lease was lost are not attempts with an outcome.
/// Attempts carry their destination (migration V3): the recent ones are read through the BRIN
/// index on `finished_at` alone. Attempts logged before V3 have none; theirs is looked up by
/// message id (a primary-key probe each, never a scan of the history).
pub const STATS_ATTEMPTS: &str = "SELECT destination, sum(n)::int8, sum(f)::int8 FROM ( \
     SELECT a.destination, count(*) AS n, count(*) FILTER (WHERE a.outcome <> 'delivered') AS f \
     FROM txoutbox_attempts a \
     WHERE a.finished_at > now() - make_interval(secs => $1) AND a.destination IS NOT NULL \
       AND a.outcome IN ('delivered', 'retry', 'failed', 'expired', 'unknown') \
     GROUP BY 1 \
     UNION ALL \
     SELECT COALESCE( \
             (SELECT m.destination FROM txoutbox_messages m WHERE m.id = a.message_id), \
             (SELECT x.destination FROM txoutbox_discarded x WHERE x.id = a.message_id), \
             (SELECT d.destination FROM txoutbox_delivered d WHERE d.id = a.message_id), \
             '(purged)'), \
         count(*), count(*) FILTER (WHERE a.outcome <> 'delivered') \
     FROM txoutbox_attempts a \
     WHERE a.finished_at > now() - make_interval(secs => $1) AND a.destination IS NULL \
       AND a.outcome IN ('delivered', 'retry', 'failed', 'expired', 'unknown') \
     GROUP BY 1) s \
 GROUP BY destination";

/// Failed rows grouped by destination and normalised error text: count, first and last failure
/// (the start of the row's last attempt, which the row keeps; its enqueue time when it has none),
/// one original text; the largest groups first, at most $1. Reads the failed rows only (the
/// partial index `txoutbox_messages_dead`), not the attempt log.
pub const FAILURE_GROUPS: &str = concat!(
    "SELECT destination, class, count(*), min(failed_at), max(failed_at), min(last_error) \
     FROM ( \
     SELECT t.destination, t.last_error, COALESCE(",
    normalised_error!("t.last_error"),
    ", '') AS class, COALESCE(t.attempt_started_at, t.created_at) AS failed_at \
     FROM txoutbox_messages t WHERE t.status = 'failed') g \
     GROUP BY destination, class ORDER BY count(*) DESC, destination, class LIMIT $1"
);

/// The last $1 minutes (this one included), minute by minute: rows delivered, failing relay
/// attempts (`retry`, `failed`, `expired`, `unknown`), and the delivery latency (delivered_at -
/// created_at, seconds) at the 50th and 99th percentiles of the minute's deliveries.
pub const ACTIVITY: &str = "WITH minutes AS ( \
     SELECT generate_series(date_trunc('minute', now()) - make_interval(mins => $1 - 1), \
         date_trunc('minute', now()), interval '1 minute') AS minute), \
 d AS ( \
     SELECT date_trunc('minute', delivered_at) AS minute, count(*) AS n, \
         percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM delivered_at - created_at)) AS p50, \
         percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM delivered_at - created_at)) AS p99 \
     FROM txoutbox_delivered \
     WHERE delivered_at >= date_trunc('minute', now()) - make_interval(mins => $1 - 1) \
     GROUP BY 1), \
 f AS ( \
     SELECT date_trunc('minute', finished_at) AS minute, count(*) AS n FROM txoutbox_attempts \
     WHERE finished_at >= date_trunc('minute', now()) - make_interval(mins => $1 - 1) \
       AND outcome IN ('retry', 'failed', 'expired', 'unknown') \
     GROUP BY 1) \
 SELECT minutes.minute, COALESCE(d.n, 0), COALESCE(f.n, 0), d.p50::float8, d.p99::float8 \
 FROM minutes LEFT JOIN d USING (minute) LEFT JOIN f USING (minute) ORDER BY minutes.minute";

/// One idempotency key ($1 scope, $2 key), with its claim time in microseconds since the epoch
/// (what its effects' downstream keys derive from) and whether its window has passed.
pub const KEY: &str = "SELECT scope, key, fingerprint, state, response_status, \
         response_headers, response_body, created_at, expires_at, \
         (extract(epoch FROM created_at) * 1000000)::int8, expires_at <= now() \
     FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2";

/// The messages a request enqueued, from whichever table holds them: those whose downstream key
/// is one derived from the claim ($2), and those written by the claim's transaction (their
/// `created_at`, the transaction's time, equals the key's, $1). Oldest first.
pub const KEY_MESSAGES: &str = "SELECT * FROM ( \
     SELECT t.id, t.seq, t.destination, t.status, t.downstream_key, t.ordering_key, t.attempts, \
         t.created_at, t.next_attempt_at, NULL::timestamptz AS delivered_at, t.last_error, \
         t.lease_owner, t.lease_expires_at, NULL::timestamptz AS discarded_at \
     FROM txoutbox_messages t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[]) \
     UNION ALL \
     SELECT t.id, t.seq, t.destination, 'delivered', t.downstream_key, t.ordering_key, \
         t.attempts, t.created_at, NULL, t.delivered_at, NULL, NULL, NULL, NULL \
     FROM txoutbox_delivered t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[]) \
     UNION ALL \
     SELECT t.id, t.seq, t.destination, 'discarded', t.downstream_key, t.ordering_key, \
         t.attempts, t.created_at, NULL, NULL, t.last_error, NULL, NULL, t.discarded_at \
     FROM txoutbox_discarded t WHERE t.created_at = $1 OR t.downstream_key = ANY($2::text[]) \
     ) r ORDER BY created_at, seq";

/// The flow-control state of every destination with a row ([`FLOW_STATE`]'s columns).
pub const FLOW_STATES: &str = concat!(flow_state!(), " ORDER BY destination");

/// The flow-control state of destination $1: `state` as the claim reads it (paused, open,
/// half_open, closed) and the tokens its bucket holds now.
pub const FLOW_STATE: &str = concat!(flow_state!(), " WHERE destination = $1");

/// An operator's pause of destination $1 by $2 for reason $3 (its row made if missing).
pub const PAUSE: &str = "INSERT INTO txoutbox_destinations AS d (destination, paused_at, \
         paused_by, paused_reason) VALUES ($1, now(), $2, $3) \
     ON CONFLICT (destination) DO UPDATE SET paused_at = COALESCE(d.paused_at, now()), \
         paused_by = $2, paused_reason = $3, updated_at = now()";

/// Ends the pause of destination $1; no row when it was not paused.
pub const RESUME: &str = "UPDATE txoutbox_destinations SET paused_at = NULL, paused_by = NULL, \
         paused_reason = NULL, updated_at = now() \
     WHERE destination = $1 AND paused_at IS NOT NULL RETURNING destination";

/// Logs a destination-wide operator action ($2: `paused`, `resumed`) on destination $1 with the
/// note $3: no message, attempt 0, relay `operator`.
pub const LOG_DESTINATION_ACTION: &str = "INSERT INTO txoutbox_attempts (message_id, destination, \
         attempt, downstream_key, relay, outcome, error, started_at, finished_at) \
     VALUES (NULL, $1, 0, '', 'operator', $2, $3, now(), now())";
