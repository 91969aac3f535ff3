-- Locks the breaker and throttle columns of destinations $1 for a feedback write.
--
-- Parameters:
-- $1 destinations: text[]
SELECT destination, breaker, failures, opens, open_until,
    open_reason, probe_until, throttled_until, throttle_reason, now() AS now
FROM txoutbox_destinations WHERE destination = ANY($1::text[])
ORDER BY destination FOR NO KEY UPDATE
