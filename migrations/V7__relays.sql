-- Why: when every relay dies, the outbox only shows it as a growing "oldest pending" age. Each
-- relay now records itself here (one row a relay process), refreshes its heartbeat every few
-- seconds with one small UPDATE, and deletes its row at a clean exit, so an operator (`txoutbox
-- relays`, the dashboard's Relays page) sees which relays are alive, when each last claimed and
-- what each holds. A relay whose heartbeat stopped (SIGKILL, a lost machine) is stale once three
-- heartbeats are missed, and pruned by the other relays a day later. Nothing reads this table on
-- a claim's or a request's path.

CREATE TABLE txoutbox_relays (
    -- the relay's owner name, as in leases and the attempt log
    owner            text        PRIMARY KEY,
    host             text        NOT NULL,
    pid              integer     NOT NULL,
    -- the txoutbox version the relay runs
    version          text        NOT NULL,
    started_at       timestamptz NOT NULL DEFAULT now(),
    heartbeat_at     timestamptz NOT NULL DEFAULT now(),
    -- how often this relay beats: it is stale once heartbeat_at is three of these old
    heartbeat_every  interval    NOT NULL CHECK (heartbeat_every > interval '0'),
    -- the database time of its last claim that took rows (NULL: none yet)
    last_claim_at    timestamptz,
    -- rows it held under a lease at its last heartbeat
    held             integer     NOT NULL DEFAULT 0,
    -- the destinations it has sinks for
    sinks            text[]      NOT NULL DEFAULT '{}',
    -- its flow bounds: {"concurrency": n, "batch_size": n, "destinations": {name: {"rate_per_sec":
    -- x, "burst": y, "max_in_flight": n, "at_most_once": bool}}} (only bounded destinations)
    flow             jsonb       NOT NULL DEFAULT '{}'
);
