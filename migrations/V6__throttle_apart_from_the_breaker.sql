-- Why: a Retry-After on one answer (one account's 429, one request's 503) delays that row only;
-- the destination pauses when the downstream as a whole throttles: most of a relay's recent
-- answers from it are 429/503 with Retry-After. That pause is the downstream's, not the circuit
-- breaker's: it ends at the time the downstream asked, with no half-open probe (each relay then
-- ramps its calls back up), and it neither opens nor closes the breaker, so it has columns of
-- its own. Every relay's claim reads them, as it reads the breaker's.

ALTER TABLE txoutbox_destinations
    -- no call of the destination starts until then, on any relay (the downstream's Retry-After,
    -- bounded by the retry cap)
    ADD COLUMN throttled_until timestamptz,
    -- why: how many of the recent answers throttled, and the wait asked
    ADD COLUMN throttle_reason text;
