-- A hint on the relays' wake-up channel.
--
-- Parameters: none.
SELECT pg_notify('txoutbox_wake', '')
