//! Every statement on the service's own tables.

/// Inserts a pending charge with the downstream key and the outbox message id of its
/// PaymentIntent.
pub const INSERT_CHARGE: &str =
    "INSERT INTO charges (id, customer_id, amount, currency, email, payment_key, \
     payment_message_id) VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// A charge as `GET /charges/{id}` shows it.
pub const CHARGE: &str =
    "SELECT id, customer_id, amount, currency, email, status, stripe_id, failure \
     FROM charges WHERE id = $1";

/// Marks the charge paid by the PaymentIntent of this outbox message (its id, which a replay
/// with a new downstream key does not change); returns its id and email (for the shipping
/// webhook).
pub const CHARGE_SUCCEEDED: &str =
    "UPDATE charges SET status = 'succeeded', stripe_id = $2, failure = NULL, updated_at = now() \
     WHERE payment_message_id = $1 RETURNING id, email";

/// Marks the charge whose PaymentIntent message was dead-lettered `failed`, unless it was paid
/// already (a replayed row that fails again does not undo a payment). Matches the charge in
/// either case, so that a dead letter without a charge is seen.
pub const CHARGE_FAILED: &str = "UPDATE charges SET \
         status = CASE WHEN status = 'succeeded' THEN status ELSE 'failed' END, \
         failure = CASE WHEN status = 'succeeded' THEN failure ELSE $2 END, \
         updated_at = now() \
     WHERE payment_message_id = $1";

/// Takes `quantity` from the stock only if that many are available, in one statement.
pub const RESERVE_STOCK: &str = "UPDATE inventory SET available = available - $2 \
     WHERE item_id = $1 AND available >= $2 RETURNING available";

/// What is left of an item (to explain a refusal).
pub const AVAILABLE: &str = "SELECT available FROM inventory WHERE item_id = $1";

/// Records a reservation.
pub const INSERT_RESERVATION: &str =
    "INSERT INTO reservations (id, item_id, quantity) VALUES ($1, $2, $3)";
