-- `class`, the failure's normalised text (`t.last_error` inside `COALESCE(left(` … `300), '')`),
-- in `messages/failure_groups.sql` and wherever the filter selects one (`parts/error_filter.sql`):
-- the failure's text with what varies between two failures of one cause replaced, and what
-- tells causes apart kept, cut to 300 characters. In order: UUIDs become `<uuid>`; email
-- addresses `<email>` (a bounce names its recipient; the dashboard scrubs the same shape from
-- the text it shows, so a group's text never holds an address); timestamps (ISO 8601 dates and
-- times, and `hh:mm:ss`) `<time>`; standalone runs of digits `<n>` (ids, amounts, card numbers),
-- except the status codes 100 to 599 (HTTP, SMTP); and words of six characters or more that mix
-- digits with letters `<id>` (`ch_3Mml…`, request ids). A run of digits or a word inside a
-- dotted name, after `:` or `-` (a host name, an address, a port, a version) is kept: failures
-- of `api.stripe.com` and of `10.0.0.5:5432` stay apart.
            regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(t.last_error,
                '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
                '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+', '<email>', 'g'),
                '[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.,][0-9]+)?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)?)?|[0-9]{2}:[0-9]{2}:[0-9]{2}([.,][0-9]+)?',
                '<time>', 'g'),
                '(?<![A-Za-z0-9_.:-])(?![1-5][0-9]{2}(?![A-Za-z0-9_]))[0-9]+(?![A-Za-z0-9_]|[.-][A-Za-z0-9])',
                '<n>', 'g'),
                '(?<![A-Za-z0-9_.:-])(?=[A-Za-z0-9_]{6})[A-Za-z_]*[0-9][A-Za-z0-9_]*(?![A-Za-z0-9_]|[.-][A-Za-z0-9])',
                '<id>', 'g'),
