-- A clean exit: relay $1's row goes.
--
-- Parameters:
-- $1 owner: text
DELETE FROM txoutbox_relays WHERE owner = $1
