-- Every relay's row, alive ones first, with its staleness and ages by the database's clock.
--
-- Parameters: none.
SELECT owner, host, pid, version, started_at, heartbeat_at,
    EXTRACT(EPOCH FROM heartbeat_every)::float8, last_claim_at, held, sinks, flow,
    heartbeat_at <= now() - 3 * heartbeat_every AS stale,
    greatest(EXTRACT(EPOCH FROM now() - started_at), 0)::float8,
    greatest(EXTRACT(EPOCH FROM now() - heartbeat_at), 0)::float8,
    greatest(EXTRACT(EPOCH FROM now() - last_claim_at), 0)::float8
FROM txoutbox_relays ORDER BY stale, host, started_at, owner
