-- The columns of `destinations/flow_state.sql` and `destinations/flow_states.sql`: `state`, the
-- flow-control state as the claim reads it (paused, open while throttled or while an open
-- breaker's time runs, half_open, closed), `throttled`, whether `open` is the downstream's
-- throttle rather than the breaker, and `tokens`, the bucket refilled to now.
SELECT destination,
    CASE WHEN paused_at IS NOT NULL THEN 'paused'
        WHEN throttled_until > now() THEN 'open'
        WHEN breaker = 'open' AND open_until > now() THEN 'open'
        WHEN breaker <> 'closed' THEN 'half_open' ELSE 'closed' END AS state,
    paused_at IS NULL AND COALESCE(throttled_until > now(), false) AS throttled,
    paused_at, paused_by, paused_reason, rate_per_sec,
    CASE WHEN rate_per_sec IS NULL THEN NULL ELSE least(burst, tokens + rate_per_sec
        * greatest(EXTRACT(EPOCH FROM now() - refilled_at)::float8, 0)) END AS tokens,
    failures,
    CASE WHEN throttled_until > now() THEN throttled_until ELSE open_until END
        AS open_until,
    CASE WHEN throttled_until > now() THEN throttle_reason ELSE open_reason END
        AS open_reason
