-- The flow-control state of destination $1: `state` as the claim reads it (paused, open,
-- half_open, closed) and the tokens its bucket holds now.
--
-- The columns, `state` and `tokens` among them, are `parts/flow_columns.sql`, the same in
-- `destinations/flow_state.sql` and `destinations/flow_states.sql`.
--
-- Parameters:
-- $1 destination: text
\i destinations/parts/flow_columns.sql
FROM txoutbox_destinations WHERE destination = $1
