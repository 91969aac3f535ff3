-- The ids a replay by filter selects: hot rows of the statuses $1, then delivered rows when $1
-- holds `delivered`, each in insertion order; at most $9 (NULL: all). Taken without locks: each
-- batch locks and checks its rows again.
--
-- The filter ($2..$13, as `store::admin::bind` binds them), over a table aliased `t`: the
-- conditions read the same in every statement that takes one; `txoutbox_delivered` keeps no
-- error text, so a filter on the error ($10, $11) selects none of its rows.
--
-- `class` (the failure's normalised text; $11 selects one) is the failure's text with what varies
-- between two failures of one cause replaced, and what tells causes apart kept, cut to 300
-- characters. In order: UUIDs become `<uuid>`; email addresses `<email>` (a bounce names its
-- recipient; the dashboard scrubs the same shape from the text it shows, so a group's text never
-- holds an address); timestamps (ISO 8601 dates and times, and `hh:mm:ss`) `<time>`; standalone
-- runs of digits `<n>` (ids, amounts, card numbers), except the status codes 100 to 599 (HTTP,
-- SMTP); and words of six characters or more that mix digits with letters `<id>` (`ch_3Mml…`,
-- request ids). A run of digits or a word inside a dotted name, after `:` or `-` (a host name, an
-- address, a port, a version) is kept: failures of `api.stripe.com` and of `10.0.0.5:5432` stay
-- apart. The same expression is in `messages/failure_groups.sql`, `messages/list.sql`,
-- `messages/discard_select.sql` and `messages/replay_select.sql`: change them together.
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
    AND ($2::text IS NULL OR t.destination = $2)
    AND ($3::timestamptz IS NULL OR t.created_at >= $3)
    AND ($4::float8 IS NULL OR t.created_at >= now() - make_interval(secs => $4))
    AND ($5::timestamptz IS NULL OR t.created_at < $5)
    AND ($6::float8 IS NULL OR t.created_at < now() - make_interval(secs => $6))
    AND ($7::text IS NULL OR t.downstream_key = $7)
    AND ($8::text IS NULL OR t.ordering_key = $8)
    AND ($12::timestamptz IS NULL OR (t.created_at, t.seq) < ($12, $13::int8))
    AND ($10::text IS NULL OR strpos(lower(t.last_error), lower($10)) > 0)
    AND ($11::text IS NULL OR COALESCE(left(
            regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(t.last_error,
                '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
                '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+', '<email>', 'g'),
                '[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.,][0-9]+)?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)?)?|[0-9]{2}:[0-9]{2}:[0-9]{2}([.,][0-9]+)?',
                '<time>', 'g'),
                '(?<![A-Za-z0-9_.:-])(?![1-5][0-9]{2}(?![A-Za-z0-9_]))[0-9]+(?![A-Za-z0-9_]|[.-][A-Za-z0-9])',
                '<n>', 'g'),
                '(?<![A-Za-z0-9_.:-])(?=[A-Za-z0-9_]{6})[A-Za-z_]*[0-9][A-Za-z0-9_]*(?![A-Za-z0-9_]|[.-][A-Za-z0-9])',
                '<id>', 'g'),
            300), '') = $11)
UNION ALL
SELECT t.id, 1, t.seq FROM txoutbox_delivered t
WHERE 'delivered' = ANY($1::text[])
    AND ($2::text IS NULL OR t.destination = $2)
    AND ($3::timestamptz IS NULL OR t.created_at >= $3)
    AND ($4::float8 IS NULL OR t.created_at >= now() - make_interval(secs => $4))
    AND ($5::timestamptz IS NULL OR t.created_at < $5)
    AND ($6::float8 IS NULL OR t.created_at < now() - make_interval(secs => $6))
    AND ($7::text IS NULL OR t.downstream_key = $7)
    AND ($8::text IS NULL OR t.ordering_key = $8)
    AND ($12::timestamptz IS NULL OR (t.created_at, t.seq) < ($12, $13::int8))
    AND $10::text IS NULL AND $11::text IS NULL) s ORDER BY place, seq LIMIT $9
