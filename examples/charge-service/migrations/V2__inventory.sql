-- Stock and reservations: `available` never goes below zero, so concurrent buyers of the last
-- item cannot both succeed (the decrement checks and writes in one statement).
CREATE TABLE inventory (
    item_id    text PRIMARY KEY,
    available  integer NOT NULL CHECK (available >= 0)
);

CREATE TABLE reservations (
    id          uuid PRIMARY KEY,
    item_id     text NOT NULL REFERENCES inventory (item_id),
    quantity    integer NOT NULL CHECK (quantity > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);
