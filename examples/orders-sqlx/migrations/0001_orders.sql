-- The service's own table, beside txoutbox's: an order is written in the same transaction as
-- its idempotency key and its two outbox rows (the receipt email, the order.created webhook),
-- so either all four exist or none does. Applied by sqlx's migrator (history in
-- _sqlx_migrations), after txoutbox's own migrations (history in txoutbox_schema_history).
CREATE TABLE orders (
    id           uuid PRIMARY KEY,
    customer_id  text NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 255),
    amount       bigint NOT NULL CHECK (amount > 0),
    email        text NOT NULL CHECK (length(email) BETWEEN 3 AND 254),
    created_at   timestamptz NOT NULL DEFAULT now()
);
