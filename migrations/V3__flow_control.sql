-- Why: flow control per destination (a rate limit shared by every relay, a circuit breaker, a
-- downstream's Retry-After pausing the whole destination, an operator's pause) must hold for every
-- relay of a deployment at once, so its state lives here, one row per destination, and each
-- relay's claim reads it. Operator pauses and resumes are destination-wide actions: they are
-- logged in txoutbox_attempts with no message.

CREATE TABLE txoutbox_destinations (
    -- the sink's name, as in txoutbox_messages.destination
    destination      text        PRIMARY KEY,
    -- an operator's pause (`txoutbox pause`): no row of the destination is claimed until resumed
    paused_at        timestamptz,
    paused_by        text,
    paused_reason    text,
    -- the token bucket shared by every relay: at most rate_per_sec calls per second, bursts of
    -- at most `burst`; written by each relay at start from its configuration (NULL: no limit)
    rate_per_sec     float8      CHECK (rate_per_sec > 0),
    burst            float8      CHECK (burst >= 1),
    tokens           float8      NOT NULL DEFAULT 0,
    refilled_at      timestamptz NOT NULL DEFAULT now(),
    -- the circuit breaker: 'open' until open_until (after `failures` consecutive retryable
    -- failures, or a downstream's Retry-After), then 'half_open' with one probe out until
    -- probe_until; a delivered probe closes it
    breaker          text        NOT NULL DEFAULT 'closed'
                                 CHECK (breaker IN ('closed', 'open', 'half_open')),
    -- consecutive retryable failures (reset by a delivery)
    failures         integer     NOT NULL DEFAULT 0,
    -- consecutive openings (the cool-down doubles with each, up to the policy's cap)
    opens            integer     NOT NULL DEFAULT 0,
    open_until       timestamptz,
    open_reason      text,
    probe_until      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- A destination-wide action (pause, resume) is logged without a message, under its destination.
ALTER TABLE txoutbox_attempts ALTER COLUMN message_id DROP NOT NULL;
ALTER TABLE txoutbox_attempts ADD COLUMN destination text;

-- Also: the operator's views of dead rows (`list --status failed`, the dashboard's failures page)
-- read failed and unknown rows through this small index, not a scan of the whole backlog; rows
-- enter it only when they are dead-lettered or lost.
CREATE INDEX txoutbox_messages_dead ON txoutbox_messages (created_at, seq)
    WHERE status IN ('failed', 'unknown');

-- Also: `list` and the dashboard show the newest rows first and page by (created_at, seq): over
-- the hot table too that is an index scan backward that stops at the page's end (one more index
-- entry per enqueued row).
CREATE INDEX txoutbox_messages_created ON txoutbox_messages (created_at, seq);
