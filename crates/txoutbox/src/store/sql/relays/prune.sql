-- Relays silent for a day past their staleness: no process is left to remove their rows.
--
-- Parameters: none.
DELETE FROM txoutbox_relays
WHERE heartbeat_at < now() - interval '24 hours' - 3 * heartbeat_every
