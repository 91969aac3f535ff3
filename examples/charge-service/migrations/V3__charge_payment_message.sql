-- Why: the completion hook found a charge by the PaymentIntent's downstream key, and
-- `txoutbox replay --new-key` rewrites that key: a declined charge replayed with a new key was paid
-- at Stripe but stayed `failed`. The outbox message id never changes, so the charge records the id
-- of its PaymentIntent message at enqueue and the hook finds the charge by it.
ALTER TABLE charges ADD COLUMN payment_message_id uuid UNIQUE;

-- Charges written before this migration: their message, by the key they were enqueued with.
UPDATE charges c SET payment_message_id = m.id
    FROM txoutbox_messages m
    WHERE m.destination = 'stripe' AND m.downstream_key = c.payment_key;
UPDATE charges c SET payment_message_id = d.id
    FROM txoutbox_delivered d
    WHERE c.payment_message_id IS NULL AND d.destination = 'stripe'
      AND d.downstream_key = c.payment_key;
