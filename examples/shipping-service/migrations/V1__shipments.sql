-- The shipping service's own table, beside txoutbox's: one shipment per charge, written with its
-- inbox record and its "your order ships" email in one transaction. `charge_id` is unique so that
-- two different webhooks about one charge (a sender that re-sent it under a new id) still make
-- one shipment.
CREATE TABLE shipments (
    id          bigserial PRIMARY KEY,
    charge_id   text NOT NULL UNIQUE,
    email       text NOT NULL,
    webhook_id  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
