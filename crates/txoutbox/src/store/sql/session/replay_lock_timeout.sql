-- Bounds every lock wait of a replay transaction: a row locked for long is an error, not a hang.
--
-- Parameters: none.
SELECT set_config('lock_timeout', '5s', true)
