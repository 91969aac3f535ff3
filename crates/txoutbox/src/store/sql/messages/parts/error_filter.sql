-- The filter's conditions on the error of a table aliased `t` that keeps one: its text contains
-- $10 (any case), its normalised text (`parts/error_class.sql`) is $11. `txoutbox_delivered`
-- keeps no error text, so a filter on the error selects none of its rows.
    AND ($10::text IS NULL OR strpos(lower(t.last_error), lower($10)) > 0)
    AND ($11::text IS NULL OR COALESCE(left(
\i messages/parts/error_class.sql
            300), '') = $11)
