//! txoutbox: idempotency keys and a transactional outbox for Postgres-backed services.
//!
//! A request's business writes, its idempotency record and the outbox rows of its downstream
//! effects commit in ONE transaction of the caller's; a relay delivers the rows afterwards and
//! forwards each row's downstream key, so the downstream deduplicates a redelivery.
//!
//! ```no_run
//! use txoutbox::{Begin, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse};
//!
//! # async fn handler(client: &mut tokio_postgres::Client, header: &str, body: &[u8])
//! #     -> Result<StoredResponse, txoutbox::Error> {
//! let key = IdempotencyKey::from_header(header)?;              // 400 when malformed
//! let scope = Scope::new("charges")?;                           // 24 h window by default
//! let fingerprint = Fingerprint::new("POST", "/charge", body);
//! let tx = client.transaction().await?;
//! match txoutbox::begin(&tx, &scope, &key, &fingerprint).await? {
//!     Begin::New(mut claim) => {
//!         tx.execute("INSERT INTO charges (amount) VALUES (100)", &[]).await?;
//!         claim.enqueue("receipt", OutboxMessage::new("email", &serde_json::json!({"to": "a@b.c"}))?)?;
//!         let response = StoredResponse { status: 201, headers: vec![], body: b"{}".to_vec() };
//!         claim.complete(&tx, &response).await?;
//!         tx.commit().await?;
//!         Ok(response)
//!     }
//!     Begin::Replay(stored) => Ok(stored),                     // the first answer, again
//!     Begin::Mismatch => Ok(StoredResponse { status: 422, headers: vec![], body: vec![] }),
//!     Begin::InFlight => Ok(StoredResponse { status: 409, headers: vec![], body: vec![] }),
//! }
//! # }
//! ```
//!
//! Layout: [`key`](IdempotencyKey) and [`Fingerprint`] validate the request; `idempotency`
//! ([`begin`], [`Claim`]) claims keys and stores responses; `outbox` ([`OutboxMessage`],
//! [`enqueue`]) writes rows; [`migrate`] applies the schema; [`prune_expired_keys`] trims the key
//! table; [`RelayWaker`] hints the relays after commit; `pg` ([`PgConfig`]) reads a connection
//! string as libpq does and opens its connections with TLS (rustls) as its `sslmode` says.

/// The channel the relays LISTEN on and the write path's hint NOTIFYs, as a literal for the
/// statements' text ([`WAKE_CHANNEL`] for code).
macro_rules! wake_channel {
    () => {
        "txoutbox_wake"
    };
}

mod admin;
mod downstream_key;
mod error;
mod fingerprint;
mod idempotency;
mod key;
mod migrate;
mod outbox;
mod pg;
mod relay;
mod shutdown;
mod sink;
mod state;
mod store;
pub mod telemetry;
mod wake;

pub use admin::{
    activity, destination_flows, discard, failure_groups, list_messages, lookup_key,
    pause_destination, prune_expired_keys, purge, replay, replay_downstream_key,
    resume_destination, show_message, stats, AdminError, AttemptRecord, DestinationFlow,
    DestinationStats, DiscardOptions, DiscardReport, DiscardedMessage, FailureGroup, FailureRate,
    IdempotencyRecord, KeyLookup, ListCursor, MessageDetail, MessageFilter, MessageSummary,
    MinuteActivity, OutboxStats, PurgeOptions, PurgeReport, ReplayOptions, ReplayReport,
    ReplaySelection, ReplayedMessage, Retention, SkippedMessage, StatusCounts, TimeBound,
    DEFAULT_FAILED_RETENTION, DEFAULT_PRUNE_BATCH, DEFAULT_REPLAY_BATCH, DEFAULT_RETENTION,
    EXACT_DELIVERED_COUNT_MAX, EXACT_HOT_COUNT_MAX, FAILURE_RATE_WINDOW,
};
pub use downstream_key::{derive_downstream_key, DOWNSTREAM_KEY_NAMESPACE};
pub use error::{Error, Result};
pub use fingerprint::Fingerprint;
pub use idempotency::{
    begin, Begin, Claim, Scope, StoredResponse, DEFAULT_LOCK_TIMEOUT, DEFAULT_MIN_KEY_LEN,
    DEFAULT_WINDOW, MAX_LOCK_TIMEOUT, MAX_WINDOW, MIN_WINDOW,
};
pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use migrate::{embedded_migrations, migrate, HISTORY_TABLE};
pub use outbox::{enqueue, Enqueued, OutboxMessage};
pub use pg::{MakeTls, PgConfig, PgConnection, PgStream, SslMode, TlsConnector, TlsError};
pub use relay::{
    reclaim_expired, Breaker, DestinationPolicy, FlowControl, RateLimit, Relay, RelayBuilder,
    RelayConfig, RelayReport, RetryPolicy, Semantics, WakeMode, MAX_RETRY_DELAY, SHUTDOWN_FLUSH,
};
pub use shutdown::Shutdown;
pub use sink::{
    crypto_provider, ensure_crypto_provider, error_chain, parse_retry_after, Completion,
    CompletionHook, Delivery, DeliveryError, Receipt, Sink,
};
pub use state::{AttemptOutcome, MessageStatus};
pub use store::{Params, TxExecutor};
pub use telemetry::{describe_metrics, register_destinations, register_scopes, Traceparent};
pub use wake::{notify_in_transaction, RelayWaker, HINT_SPACING, WAKE_CHANNEL};
