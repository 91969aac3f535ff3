-- The flow-control state of every destination with a row (`destinations/flow_state.sql`'s columns).
--
-- The columns, `state` and `tokens` among them, are `parts/flow_columns.sql`, the same in
-- `destinations/flow_state.sql` and `destinations/flow_states.sql`.
--
-- Parameters: none.
\i destinations/parts/flow_columns.sql
FROM txoutbox_destinations ORDER BY destination
