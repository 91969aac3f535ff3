-- The planner's estimate of the delivered history: its row count (`pg_class.reltuples`, -1 when
-- never analysed) and the most common destinations with their frequencies (`pg_stats`), as
-- ANALYZE (autovacuum) last sampled them. Reads the catalogue only.
--
-- Parameters: none.
SELECT c.reltuples::float8,
    s.most_common_vals::text::text[], s.most_common_freqs::float8[]
FROM pg_class c
LEFT JOIN pg_stats s ON s.schemaname = c.relnamespace::regnamespace::text
    AND s.tablename = c.relname AND s.attname = 'destination'
WHERE c.oid = 'txoutbox_delivered'::regclass
