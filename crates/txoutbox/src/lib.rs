//! txoutbox: idempotency keys and a transactional outbox for Postgres-backed services.
//!
//! A request's business writes, its idempotency record and the outbox rows of its downstream
//! effects commit in ONE transaction of the caller's; a relay delivers the rows afterwards and
//! forwards each row's downstream key, so the downstream deduplicates a redelivery.
//!
//! ```
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
//! # txoutbox_test_support::doc_test(|mut client| async move {
//! #     client.batch_execute("CREATE TABLE charges (amount int)").await?;
//! #     let header = "9b3e3c4f-4d1e-4e7a-9d3c-2f0c5a1e8b7d";
//! #     assert_eq!(handler(&mut client, header, b"{}").await?.status, 201);
//! #     assert_eq!(handler(&mut client, header, b"{}").await?.status, 201); // replayed
//! #     assert_eq!(handler(&mut client, header, b"{\"other\":1}").await?.status, 422);
//! #     let charges: i64 = client.query_one("SELECT count(*) FROM charges", &[]).await?.get(0);
//! #     assert_eq!(charges, 1);
//! #     Ok(())
//! # });
//! ```
//!
//! The cheapest path writes one row per request and commits in one round trip with it: a scope
//! with [`Scope::with_deferred_effects`] (the effects ride on the key row until the relay fans
//! them out) and [`Claim::commit`] in place of `complete` and `commit`:
//!
//! ```
//! # use txoutbox::{Begin, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse};
//! # async fn handler(client: &mut tokio_postgres::Client, key: IdempotencyKey, fingerprint: Fingerprint)
//! #     -> Result<(), txoutbox::Error> {
//! let scope = Scope::new("charges")?.with_deferred_effects();
//! let tx = client.transaction().await?;
//! if let Begin::New(mut claim) = txoutbox::begin(&tx, &scope, &key, &fingerprint).await? {
//!     tx.execute("INSERT INTO charges (amount) VALUES (100)", &[]).await?;
//!     claim.enqueue("receipt", OutboxMessage::new("email", &serde_json::json!({"to": "a@b.c"}))?)?;
//!     let response = StoredResponse { status: 201, headers: vec![], body: b"{}".to_vec() };
//!     claim.commit(tx, &response).await?;                     // key, response, effects, COMMIT
//! }
//! # Ok(())
//! # }
//! # txoutbox_test_support::doc_test(|mut client| async move {
//! #     client.batch_execute("CREATE TABLE charges (amount int)").await?;
//! #     let key = IdempotencyKey::from_header("9b3e3c4f-4d1e-4e7a-9d3c-2f0c5a1e8b7d")?;
//! #     handler(&mut client, key, Fingerprint::new("POST", "/charge", b"{}")).await?;
//! #     // One row: the key with its response and its deferred effect.
//! #     let counts = txoutbox_test_support::counts(&client).await?;
//! #     assert_eq!((counts.keys, counts.pending), (1, 0));
//! #     Ok(())
//! # });
//! ```
//!
//! The write path runs in the caller's transaction on tokio-postgres, deadpool or (feature
//! `sqlx`) sqlx: `begin(&tx, …)` on the first two, `begin(&mut tx, …)` on a
//! `sqlx::Transaction<'_, Postgres>` ([`WriteTx`], [`CommitTx`]); `migrate_sqlx` applies the
//! schema over a sqlx connection. Which to use and what sqlx costs: the repository's
//! `docs/drivers.md`.
//!
//! Layout: the root holds the write path: [`IdempotencyKey`] and [`Fingerprint`] validate the
//! request, [`begin`] and [`Claim`] claim its key and store its response, [`OutboxMessage`] and
//! [`enqueue`] write its effects, [`migrate`] applies the schema and [`check_schema`] says whether
//! the database's is the one this build needs. The rest is in namespaces:
//! [`idempotency`] (the key window's limits, downstream keys), [`relay`] (the worker that
//! delivers, its configuration, the wake-up hint after commit), [`sink`] (what a downstream
//! implements), [`admin`] (what operators run: list, show, replay, discard, purge, stats, pause),
//! [`telemetry`] (metric names, trace context) and [`pg`] (connection strings read as libpq
//! does, TLS by `sslmode`).

/// The channel the relays LISTEN on and the write path's hint NOTIFYs, as a literal for the
/// statements' text ([`relay::WAKE_CHANNEL`] for code).
macro_rules! wake_channel {
    () => {
        "txoutbox_wake"
    };
}

/// `Display` as the name `as_str()` gives: the enums whose text is a column's value or an
/// option's word print as they are stored and parsed.
macro_rules! display_as_str {
    ($($name:ty),+ $(,)?) => {$(
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}

pub mod admin;
mod downstream_key;
mod error;
mod fingerprint;
pub mod idempotency;
pub mod inbox;
mod key;
mod migrate;
mod outbox;
pub mod pg;
pub mod relay;
mod schema;
mod shutdown;
pub mod sink;
pub mod standard_webhooks;
mod state;
mod store;
pub mod telemetry;
mod wake;

pub use error::{Error, Result};
pub use fingerprint::Fingerprint;
pub use idempotency::{begin, Begin, Claim, Scope, StoredResponse};
pub use key::IdempotencyKey;
pub use migrate::migrate;
#[cfg(feature = "sqlx")]
pub use migrate::migrate_sqlx;
pub use outbox::{enqueue, Enqueued, OutboxMessage};
pub use schema::{check_schema, SchemaMismatch, SchemaVersion};
pub use store::driver::{CommitTx, WriteTx};
