-- Why: the receiving half. A service that receives our webhooks or JetStream messages gets each one
-- at least once; to make one effect of each, it records (consumer, message id) in the same
-- transaction as the effect (`txoutbox::inbox::receive`). The record commits with the business
-- change or not at all, so a redelivery finds it and is acknowledged without running the handler
-- again. Records live for a window per consumer (7 days by default: longer than any sender's retry
-- budget) and are pruned by `txoutbox purge` in bounded batches. (V6 and V7 are other changes.)

-- One received message per row.
CREATE TABLE txoutbox_inbox (
    -- the receiving handler's name (one id space per consumer: two consumers of one stream each
    -- run once)
    consumer       text        NOT NULL,
    -- the sender's message id: `webhook-id`, `Nats-Msg-Id`, or a stream and sequence
    message_id     text        NOT NULL,
    -- when the message was first received (the receiving transaction's time)
    received_at    timestamptz NOT NULL,
    -- when the window ends: after it, a message with this id is new again
    expires_at     timestamptz NOT NULL,
    -- `processed` (the handler ran and committed) or `failed` (the handler failed for good and
    -- the message was given up; `error` says why): either way a redelivery is a duplicate
    outcome        text        NOT NULL DEFAULT 'processed'
                               CHECK (outcome IN ('processed', 'failed')),
    error          text,
    PRIMARY KEY (consumer, message_id)
);

-- The purge deletes the oldest expired records first, a batch at a time, through this index.
CREATE INDEX txoutbox_inbox_expires ON txoutbox_inbox (expires_at);

-- `txoutbox stats` counts the messages consumers gave up; they are few, and read through this
-- small index instead of a scan of the window's records.
CREATE INDEX txoutbox_inbox_failed ON txoutbox_inbox (received_at) WHERE outcome = 'failed';
