-- The service's own tables, beside txoutbox's: a charge is written with its outbox rows in one
-- transaction and marked succeeded/failed by the relay's completion hook (matched on the
-- downstream key forwarded to Stripe).
CREATE TABLE charges (
    id             uuid PRIMARY KEY,
    customer_id    text NOT NULL,
    amount         bigint NOT NULL CHECK (amount > 0),
    currency       text NOT NULL,
    email          text NOT NULL,
    status         text NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'succeeded', 'failed')),
    payment_key    text NOT NULL UNIQUE,
    stripe_id      text,
    failure        text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
