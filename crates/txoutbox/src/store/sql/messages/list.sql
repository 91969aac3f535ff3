-- Lists messages of status $1 (NULL: any, `delivered` and `discarded` included) matching the
-- filter, newest first (keyset order: (created_at, seq) descending), at most $9 (NULL: all).
-- Each table is ordered and limited on its own before the merge: a branch with conditions is not
-- merged in order otherwise, so the (created_at, seq) index of the delivered history could not
-- serve a page; a page costs the same however large the history is.
--
-- The filter ($2..$13, as `store::admin::bind` binds them), over a table aliased `t`: its
-- conditions are `parts/filter.sql` and, on the tables that keep an error text,
-- `parts/error_filter.sql` (`txoutbox_delivered` keeps none, so a filter on the error selects
-- none of its rows), each in its place by a `\i` line (`store/statements.rs`).
--
-- Parameters:
-- $1 status: text
-- $2 destination: text
-- $3 since_at: timestamptz
-- $4 since_ago: float8
-- $5 until_at: timestamptz
-- $6 until_ago: float8
-- $7 downstream_key: text
-- $8 ordering_key: text
-- $9 limit: int8
-- $10 error_contains: text
-- $11 error_class: text
-- $12 before_at: timestamptz
-- $13 before_seq: int8
SELECT * FROM ((
SELECT t.id, t.seq, t.destination, t.status, t.downstream_key, t.ordering_key, t.attempts,
    t.created_at, t.next_attempt_at, NULL::timestamptz AS delivered_at, t.last_error,
    t.lease_owner, t.lease_expires_at, NULL::timestamptz AS discarded_at
FROM txoutbox_messages t WHERE ($1::text IS NULL OR t.status = $1)
\i messages/parts/filter.sql
\i messages/parts/error_filter.sql
ORDER BY t.created_at DESC, t.seq DESC LIMIT $9)
UNION ALL (
SELECT t.id, t.seq, t.destination, 'delivered', t.downstream_key, t.ordering_key,
    t.attempts, t.created_at, NULL, t.delivered_at, NULL, NULL, NULL, NULL
FROM txoutbox_delivered t WHERE ($1::text IS NULL OR $1 = 'delivered')
\i messages/parts/filter.sql
    AND $10::text IS NULL AND $11::text IS NULL
ORDER BY t.created_at DESC, t.seq DESC LIMIT $9)
UNION ALL (
SELECT t.id, t.seq, t.destination, 'discarded', t.downstream_key, t.ordering_key,
    t.attempts, t.created_at, NULL, NULL, t.last_error, NULL, NULL, t.discarded_at
FROM txoutbox_discarded t WHERE ($1::text IS NULL OR $1 = 'discarded')
\i messages/parts/filter.sql
\i messages/parts/error_filter.sql
ORDER BY t.created_at DESC, t.seq DESC LIMIT $9)) r
ORDER BY created_at DESC, seq DESC LIMIT $9
