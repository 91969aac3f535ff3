//! Every statement on the service's own tables.

/// Inserts a pending charge.
pub const INSERT_CHARGE: &str =
    "INSERT INTO charges (id, customer_id, amount, currency, email, payment_key) \
     VALUES ($1, $2, $3, $4, $5, $6)";

/// A charge as `GET /charges/{id}` shows it.
pub const CHARGE: &str =
    "SELECT id, customer_id, amount, currency, email, status, stripe_id, failure \
     FROM charges WHERE id = $1";

/// Marks the charge paid by the PaymentIntent with this downstream key.
pub const CHARGE_SUCCEEDED: &str =
    "UPDATE charges SET status = 'succeeded', stripe_id = $2, failure = NULL, updated_at = now() \
     WHERE payment_key = $1";

/// Marks the charge whose PaymentIntent was dead-lettered.
pub const CHARGE_FAILED: &str =
    "UPDATE charges SET status = 'failed', failure = $2, updated_at = now() \
     WHERE payment_key = $1 AND status = 'pending'";

/// Takes `quantity` from the stock only if that many are available, in one statement.
pub const RESERVE_STOCK: &str = "UPDATE inventory SET available = available - $2 \
     WHERE item_id = $1 AND available >= $2 RETURNING available";

/// What is left of an item (to explain a refusal).
pub const AVAILABLE: &str = "SELECT available FROM inventory WHERE item_id = $1";

/// Records a reservation.
pub const INSERT_RESERVATION: &str =
    "INSERT INTO reservations (id, item_id, quantity) VALUES ($1, $2, $3)";
