-- The filter's conditions on a table aliased `t` ($2..$8, $12, $13, as `store::admin::bind` binds
-- them), the same in every statement that takes a filter (`messages/list.sql`,
-- `messages/discard_select.sql`, `messages/replay_select.sql`); the conditions on the error
-- ($10, $11) are `parts/error_filter.sql`, on the tables that keep one.
    AND ($2::text IS NULL OR t.destination = $2)
    AND ($3::timestamptz IS NULL OR t.created_at >= $3)
    AND ($4::float8 IS NULL OR t.created_at >= now() - make_interval(secs => $4))
    AND ($5::timestamptz IS NULL OR t.created_at < $5)
    AND ($6::float8 IS NULL OR t.created_at < now() - make_interval(secs => $6))
    AND ($7::text IS NULL OR t.downstream_key = $7)
    AND ($8::text IS NULL OR t.ordering_key = $8)
    AND ($12::timestamptz IS NULL OR (t.created_at, t.seq) < ($12, $13::int8))
