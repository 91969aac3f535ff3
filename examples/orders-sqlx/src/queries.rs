//! Every statement on the service's own table (txoutbox's statements are the library's).

/// Inserts an order. $1 id (uuid), $2 customer_id, $3 amount (bigint, > 0), $4 email.
pub const INSERT_ORDER: &str =
    "INSERT INTO orders (id, customer_id, amount, email) VALUES ($1, $2, $3, $4)";

/// An order as `GET /orders/{id}` shows it. $1 id (uuid).
pub const ORDER: &str =
    "SELECT id, customer_id, amount, email, created_at FROM orders WHERE id = $1";
