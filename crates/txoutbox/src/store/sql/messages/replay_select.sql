-- The ids a replay by filter selects: hot rows of the statuses $1, then delivered rows when $1
-- holds `delivered`, each in insertion order; at most $9 (NULL: all). Taken without locks: each
-- batch locks and checks its rows again.
--
-- The filter ($2..$13, as `store::admin::bind` binds them), over a table aliased `t`: its
-- conditions are `parts/filter.sql` and, on the tables that keep an error text,
-- `parts/error_filter.sql` (`txoutbox_delivered` keeps none, so a filter on the error selects
-- none of its rows), each in its place by a `\i` line (`store/statements.rs`).
--
-- Parameters:
-- $1 statuses: text[]
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
SELECT id FROM (
SELECT t.id, 0 AS place, t.seq FROM txoutbox_messages t
WHERE t.status = ANY($1::text[])
\i messages/parts/filter.sql
\i messages/parts/error_filter.sql
UNION ALL
SELECT t.id, 1, t.seq FROM txoutbox_delivered t
WHERE 'delivered' = ANY($1::text[])
\i messages/parts/filter.sql
    AND $10::text IS NULL AND $11::text IS NULL) s ORDER BY place, seq LIMIT $9
