-- Whether the planner has column statistics for the hot table, and (only when it has none)
-- whether the table holds 1 000 rows or more. Without statistics the planner guesses a dozen
-- pending rows whatever the backlog, and the claim reads every due row and sorts them instead
-- of walking the due index.
--
-- Parameters: none.
WITH s AS (SELECT EXISTS (
        SELECT 1 FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename
            JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname
        WHERE c.oid = 'txoutbox_messages'::regclass AND s.attname = 'status') AS analyzed)
SELECT analyzed,
    CASE WHEN analyzed THEN false
        ELSE EXISTS (SELECT 1 FROM txoutbox_messages OFFSET 999) END AS large
FROM s
