-- The highest migration applied (0 for an empty history). Cast: refinery's `version` column is
-- `int4`, or `int8` when built with its `int8-versions` feature. The table is found through the
-- search path, as refinery finds it when it migrates.
--
-- Parameters: none.
SELECT COALESCE(max(version), 0)::int4 FROM txoutbox_schema_history
