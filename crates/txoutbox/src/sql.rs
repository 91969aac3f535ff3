//! Every SQL statement of the write path, one place per table. The relay's and the operator's
//! statements live in their own modules' `sql` sections.
//!
//! Statements are sent with `query_typed` (parse, bind and execute in one round trip), so they work
//! behind PgBouncer in transaction mode and never need a prepare round trip.

/// Idempotency keys.
pub mod keys {
    /// Claims a key: inserts it, or takes over an expired one, and returns a row only when the key
    /// is now ours. A live key conflicts: the insert waits for a concurrent holder's transaction,
    /// bounded by a short lock timeout ($5), and then returns nothing.
    ///
    /// One statement does what would otherwise take three: the `state` expression saves the
    /// caller's `lock_timeout` and sets ours before the row is inserted (the wait for a conflicting
    /// row happens after the values are computed), and RETURNING restores it once the row is ours.
    /// When the key is taken, [`LOOKUP`] restores it; when the wait times out, the transaction is
    /// aborted and the setting dies with it. The nesting fixes the evaluation order.
    ///
    /// The second column is the claim's time (`created_at`, microseconds since the epoch): the
    /// effects of this claim derive their downstream keys from it, so a new claim of the key
    /// after its window (a takeover, or an insert after the pruner removed it) gets new keys.
    pub const CLAIM: &str = "INSERT INTO txoutbox_idempotency_keys \
         (scope, key, fingerprint, state, expires_at) \
         VALUES ($1, $2, $3, \
             CASE WHEN set_config('lock_timeout', CASE WHEN set_config( \
                 'txoutbox.saved_lock_timeout', current_setting('lock_timeout'), true) \
                 IS NULL THEN $5 ELSE $5 END, true) IS NULL THEN 'in_flight' ELSE 'in_flight' END, \
             now() + make_interval(secs => $4)) \
         ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
             state = 'in_flight', response_status = NULL, response_headers = NULL, \
             response_body = NULL, created_at = now(), expires_at = EXCLUDED.expires_at \
         WHERE txoutbox_idempotency_keys.expires_at <= now() \
         RETURNING set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), true), \
             (extract(epoch FROM created_at) * 1000000)::int8";

    /// Reads a live key that the claim found taken, restoring the caller's lock timeout.
    pub const LOOKUP: &str = "SELECT fingerprint, state, response_status, response_headers, \
         response_body, set_config('lock_timeout', current_setting('txoutbox.saved_lock_timeout'), \
         true) FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2";

    /// Stores the response and writes the request's outbox rows in one statement; returns the
    /// ids and destinations of the rows written (NULL when none was: all were already enqueued).
    pub const COMPLETE_WITH_MESSAGES: &str = "WITH messages AS ( \
         INSERT INTO txoutbox_messages \
             (id, destination, payload, headers, downstream_key, ordering_key) \
         SELECT * FROM unnest($6::uuid[], $7::text[], $8::jsonb[], $9::jsonb[], $10::text[], \
             $11::text[]) \
         ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination) \
         UPDATE txoutbox_idempotency_keys SET state = 'completed', response_status = $3, \
             response_headers = $4, response_body = $5 \
         WHERE scope = $1 AND key = $2 \
         RETURNING (SELECT array_agg(id) FROM messages), \
             (SELECT array_agg(destination) FROM messages)";

    /// Deletes one bounded batch of expired keys; skips rows a request holds right now.
    pub const PRUNE_EXPIRED: &str =
        "DELETE FROM txoutbox_idempotency_keys WHERE (scope, key) IN ( \
         SELECT scope, key FROM txoutbox_idempotency_keys WHERE expires_at <= now() \
         ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING 1";
}

/// Outbox rows.
pub mod messages {
    /// Inserts a batch of messages; a (destination, downstream key) already present is skipped.
    /// Returns the id and destination of each row written.
    pub const INSERT: &str = "INSERT INTO txoutbox_messages \
         (id, destination, payload, headers, downstream_key, ordering_key) \
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::text[], \
             $6::text[]) \
         ON CONFLICT (destination, downstream_key) DO NOTHING RETURNING id, destination";

    /// Serialises the transactions that enqueue under the same ordering keys, so that insertion
    /// order (`seq`) is commit order within a key. Locks in a fixed order to avoid deadlocks.
    pub const LOCK_ORDERING_KEYS: &str = "SELECT count(pg_advisory_xact_lock(h)) FROM ( \
         SELECT DISTINCT hashtextextended(k, 7160) AS h FROM unnest($1::text[]) AS k ORDER BY h) AS l";

    /// A hint on the relays' wake-up channel.
    pub const NOTIFY: &str = concat!("SELECT pg_notify('", wake_channel!(), "', '')");
}
