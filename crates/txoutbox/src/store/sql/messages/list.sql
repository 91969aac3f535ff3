-- Lists messages of status $1 (NULL: any, `delivered` and `discarded` included) matching the
-- filter, newest first (keyset order: (created_at, seq) descending), at most $9 (NULL: all).
-- Each table is ordered and limited on its own before the merge: a branch with conditions is not
-- merged in order otherwise, so the (created_at, seq) index of the delivered history could not
-- serve a page; a page costs the same however large the history is.
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
ORDER BY t.created_at DESC, t.seq DESC LIMIT $9)
UNION ALL (
SELECT t.id, t.seq, t.destination, 'delivered', t.downstream_key, t.ordering_key,
    t.attempts, t.created_at, NULL, t.delivered_at, NULL, NULL, NULL, NULL
FROM txoutbox_delivered t WHERE ($1::text IS NULL OR $1 = 'delivered')
    AND ($2::text IS NULL OR t.destination = $2)
    AND ($3::timestamptz IS NULL OR t.created_at >= $3)
    AND ($4::float8 IS NULL OR t.created_at >= now() - make_interval(secs => $4))
    AND ($5::timestamptz IS NULL OR t.created_at < $5)
    AND ($6::float8 IS NULL OR t.created_at < now() - make_interval(secs => $6))
    AND ($7::text IS NULL OR t.downstream_key = $7)
    AND ($8::text IS NULL OR t.ordering_key = $8)
    AND ($12::timestamptz IS NULL OR (t.created_at, t.seq) < ($12, $13::int8))
    AND $10::text IS NULL AND $11::text IS NULL
ORDER BY t.created_at DESC, t.seq DESC LIMIT $9)
UNION ALL (
SELECT t.id, t.seq, t.destination, 'discarded', t.downstream_key, t.ordering_key,
    t.attempts, t.created_at, NULL, NULL, t.last_error, NULL, NULL, t.discarded_at
FROM txoutbox_discarded t WHERE ($1::text IS NULL OR $1 = 'discarded')
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
ORDER BY t.created_at DESC, t.seq DESC LIMIT $9)) r
ORDER BY created_at DESC, seq DESC LIMIT $9
