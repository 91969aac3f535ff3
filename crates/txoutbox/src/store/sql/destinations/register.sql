-- Records the rate limits of a relay's destinations (NULL: none) and gives every destination
-- it serves its flow-control row. A relay starting writes its configuration over the last one.
--
-- Parameters:
-- $1 destinations: text[]
-- $2 rates: float8[]
-- $3 bursts: float8[]
INSERT INTO txoutbox_destinations AS d
    (destination, rate_per_sec, burst, tokens)
SELECT destination, rate, burst, COALESCE(burst, 0)
FROM unnest($1::text[], $2::float8[], $3::float8[]) AS i(destination, rate, burst)
ON CONFLICT (destination) DO UPDATE SET rate_per_sec = EXCLUDED.rate_per_sec,
    burst = EXCLUDED.burst, tokens = least(d.tokens, COALESCE(EXCLUDED.burst, d.tokens)),
    updated_at = now()
WHERE d.rate_per_sec IS DISTINCT FROM EXCLUDED.rate_per_sec
    OR d.burst IS DISTINCT FROM EXCLUDED.burst
