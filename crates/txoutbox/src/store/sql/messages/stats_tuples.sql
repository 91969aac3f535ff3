-- The hot table's size as the planner last saw it (`pg_class.reltuples`; -1: never analysed).
--
-- Parameters: none.
SELECT reltuples::float8 FROM pg_class WHERE oid = 'txoutbox_messages'::regclass
