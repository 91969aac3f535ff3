-- Writes the breaker and throttle columns computed from a batch's outcomes.
--
-- Parameters:
-- $1 names: text[]
-- $2 breakers: text[]
-- $3 failures: int4[]
-- $4 opens: int4[]
-- $5 open_until: timestamptz[]
-- $6 reasons: text[]
-- $7 probe_until: timestamptz[]
-- $8 throttled_until: timestamptz[]
-- $9 throttle_reasons: text[]
UPDATE txoutbox_destinations d SET breaker = u.breaker,
    failures = u.failures, opens = u.opens, open_until = u.open_until,
    open_reason = u.open_reason, probe_until = u.probe_until,
    throttled_until = u.throttled_until, throttle_reason = u.throttle_reason,
    updated_at = now()
FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[], $5::timestamptz[], $6::text[],
    $7::timestamptz[], $8::timestamptz[], $9::text[]) AS u(destination, breaker, failures,
    opens, open_until, open_reason, probe_until, throttled_until, throttle_reason)
WHERE d.destination = u.destination
