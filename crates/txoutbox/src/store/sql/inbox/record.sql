-- Records message $2 of consumer $1, received now, for a window of $3 seconds, with outcome $4
-- (`processed`, or `failed` with the error $5). Returns a row only when the record is new.
-- $1..$5 are `inbox/take_over.sql`'s, so that both bind one record alike.
--
-- The primary key is the lock: a concurrent delivery of the same id waits on this insert until
-- the first transaction ends (then finds its record, or, after a rollback, inserts its own). A
-- redelivery of a committed message waits for nothing and locks nothing (`DO NOTHING`), so a
-- storm of redeliveries does not queue up behind itself. The wait is bounded by $6 (a
-- `lock_timeout`, as Postgres reads it: `2000ms`): the caller's timeout is saved and ours set
-- in the values, evaluated before the insert can wait, and restored by RETURNING, or by
-- `inbox/lookup.sql` when no row comes back; a wait that times out aborts the transaction, and the
-- setting dies with it. Under REPEATABLE READ or SERIALIZABLE a record committed after the
-- transaction's snapshot makes Postgres refuse the insert (40001).
--
-- Parameters:
-- $1 consumer: text
-- $2 message_id: text
-- $3 window_secs: float8
-- $4 outcome: text
-- $5 error: text
-- $6 lock_timeout: text
INSERT INTO txoutbox_inbox
(consumer, message_id, received_at, expires_at, outcome, error)
VALUES ($1, $2, now(), now() + make_interval(secs => $3),
    CASE WHEN set_config('lock_timeout', CASE WHEN set_config(
        'txoutbox.saved_lock_timeout', current_setting('lock_timeout'), true)
        IS NULL THEN $6 ELSE $6 END, true) IS NULL THEN $4 ELSE $4 END, $5)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING received_at,
    set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true)
