-- Records relay $1 (host $2, pid $3, version $4, heartbeat every $5 seconds, last claim $6,
-- holding $7 rows, sinks $8, bounds $9), or refreshes its row. A row of the same owner from
-- another process (an owner name reused after a restart) starts again; the same process
-- registering again (its row was pruned while it could not reach the database) keeps its start.
--
-- Parameters:
-- $1 owner: text
-- $2 host: text
-- $3 pid: int4
-- $4 version: text
-- $5 heartbeat_secs: float8
-- $6 last_claim: timestamptz
-- $7 held: int4
-- $8 sinks: text[]
-- $9 flow: jsonb
INSERT INTO txoutbox_relays AS r (owner, host, pid, version,
    heartbeat_every, last_claim_at, held, sinks, flow)
VALUES ($1, $2, $3, $4, make_interval(secs => $5), $6, $7, $8, $9)
ON CONFLICT (owner) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid,
    version = EXCLUDED.version, heartbeat_at = now(),
    heartbeat_every = EXCLUDED.heartbeat_every, last_claim_at = EXCLUDED.last_claim_at,
    held = EXCLUDED.held, sinks = EXCLUDED.sinks, flow = EXCLUDED.flow,
    started_at = CASE WHEN r.host = EXCLUDED.host AND r.pid = EXCLUDED.pid
        THEN r.started_at ELSE now() END
