-- Why: an operator must be able to close a dead-lettered (or unknown) row without delivering it,
-- so that it stops blocking the rows of its ordering key, and keep a record of that decision for as
-- long as failures are kept (`txoutbox discard`). Discarded rows leave the hot table (as delivered
-- ones do), so txoutbox_messages, its CHECK constraint and the claim's partial index are unchanged.
-- Also: `txoutbox list --status delivered` reads the newest delivered rows through an index, not a
-- scan of the whole history.

-- Rows an operator closed without delivery, moved out of txoutbox_messages by `txoutbox discard`.
-- Pruned after their own retention (90 days by default, like failed rows).
CREATE TABLE txoutbox_discarded (
    -- the outbox row's id, unchanged
    id               uuid        PRIMARY KEY,
    -- the row's insertion order, kept for listing
    seq              bigint      NOT NULL,
    -- as in txoutbox_messages
    destination      text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb       NOT NULL,
    downstream_key   text        NOT NULL,
    ordering_key     text,
    -- attempts made before the discard
    attempts         integer     NOT NULL,
    -- the state it was discarded from
    discarded_from   text        NOT NULL CHECK (discarded_from IN ('failed', 'unknown')),
    -- its last failure's text, as it was in the hot table
    last_error       text,
    -- the operator's reason (also in the attempt log, outcome 'discarded')
    reason           text        NOT NULL,
    -- enqueue time and discard time
    created_at       timestamptz NOT NULL,
    discarded_at     timestamptz NOT NULL DEFAULT now()
);
-- the purge deletes the oldest discarded rows first
CREATE INDEX txoutbox_discarded_discarded_at ON txoutbox_discarded (discarded_at);

-- `list` shows the newest rows first and pages by (created_at, seq): over the delivered history
-- that is an index scan backward that stops at the page's end, whatever the history's size.
CREATE INDEX txoutbox_delivered_created ON txoutbox_delivered (created_at, seq);
