//! The write path's conformance suite: every behaviour a service relies on, written once
//! ([`cases`]) and run once per driver ([`drivers`]: tokio-postgres, deadpool, sqlx) by the
//! `conformance!` macro of `tests/conformance.rs`, so a driver that answers differently fails by
//! name (`sqlx::a_retry_with_the_same_key_replays_the_stored_answer`).
//!
//! Layout: [`Driver`] is what a driver gives the suite (a connection, and a request run in a
//! transaction of its own); [`Request`] and [`Outcome`] are what goes in and comes out; [`cases`]
//! holds the behaviours. Adding a driver to txoutbox means implementing [`Driver`] for it here
//! and adding one line to the macro's list.

pub mod cases;
pub mod drivers;

use std::future::Future;

use txoutbox::inbox::Consumer;
use txoutbox::{
    Enqueued, Error, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse,
};
use txoutbox_test_support::ConnInfo;

/// How a request ends once its work is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `Claim::complete`, then the transaction's commit.
    CompleteThenCommit,
    /// `Claim::commit`: the key stored and the transaction committed in one call.
    ClaimCommit,
    /// `Claim::complete`, then a rollback (the handler failed after storing its answer).
    CompleteThenRollback,
}

/// A hook run inside the request's transaction, before `txoutbox::begin` (stops the server).
pub type Hook = Box<dyn FnOnce() -> anyhow::Result<()> + Send>;

/// One idempotent request: claim the key, insert a row into `orders` (the business write),
/// enqueue the effects, store [`Request::response`] and finish.
pub struct Request {
    /// The key's scope.
    pub scope: Scope,
    /// The request's key.
    pub key: IdempotencyKey,
    /// What makes two requests the same.
    pub fingerprint: Fingerprint,
    /// The business row's note.
    pub note: String,
    /// The effects: (effect name, message).
    pub effects: Vec<(String, OutboxMessage)>,
    /// How the request ends.
    pub finish: Finish,
    /// Run after BEGIN, before `txoutbox::begin`.
    pub after_begin: Option<Hook>,
}

impl Request {
    /// A request with two effects (an email, a webhook), finished with complete and commit.
    pub fn new(scope: Scope, key: &str, amount: i64) -> anyhow::Result<Self> {
        Ok(Self {
            scope,
            key: txoutbox_test_support::request::key(key),
            fingerprint: txoutbox_test_support::request::charge_fingerprint(amount),
            note: format!("amount {amount}"),
            effects: vec![
                (
                    "receipt".into(),
                    OutboxMessage::new("email", &serde_json::json!({"to": "a@example.com"}))?,
                ),
                (
                    "notify".into(),
                    OutboxMessage::new("webhook", &serde_json::json!({"amount": amount}))?,
                ),
            ],
            finish: Finish::CompleteThenCommit,
            after_begin: None,
        })
    }

    /// The same request, finished another way.
    pub fn finish(mut self, finish: Finish) -> Self {
        self.finish = finish;
        self
    }

    /// The answer the request stores.
    pub fn response(&self) -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: format!(r#"{{"note":{:?}}}"#, self.note).into_bytes(),
        }
    }
}

/// What a request came to.
#[derive(Debug)]
pub enum Outcome {
    /// The key was new: the work ran, and these effects were written.
    New(Enqueued),
    /// The stored answer of an earlier request.
    Replay(StoredResponse),
    /// The key belongs to another request (422).
    Mismatch,
    /// Another request holds the key (409).
    InFlight,
    /// txoutbox refused or failed.
    Failed(Error),
}

/// What [`Driver::business_request`] came to (`BusinessKey`).
#[derive(Debug, PartialEq, Eq)]
pub enum RowOutcome {
    /// The row was inserted (its id); one effect enqueued.
    New(i64),
    /// The row of the first request (its id).
    Replay(i64),
    /// A row with the key from another request (422).
    Mismatch,
    /// Another request holds the key (409).
    InFlight,
}

/// A driver as the suite uses it. Every method runs in a transaction of its own on `conn`.
pub trait Driver: 'static {
    /// A connection of the driver's.
    type Conn: Send + 'static;

    /// Connects to `db`.
    fn connect(db: &ConnInfo) -> impl Future<Output = anyhow::Result<Self::Conn>> + Send;

    /// Runs `request` in a new transaction on `conn`.
    fn request(
        conn: &mut Self::Conn,
        request: Request,
    ) -> impl Future<Output = anyhow::Result<Outcome>> + Send;

    /// Runs `request` (new key expected) in a savepoint of an outer transaction that has
    /// written a row, finished with `Claim::commit`; rolls the outer transaction back and
    /// returns `Claim::commit`'s error.
    fn commit_in_savepoint(
        conn: &mut Self::Conn,
        request: Request,
    ) -> impl Future<Output = anyhow::Result<Error>> + Send;

    /// A `BusinessKey` request on the table `charges`: insert the row, enqueue one effect,
    /// complete, commit.
    fn business_request(
        conn: &mut Self::Conn,
        key: &IdempotencyKey,
        amount: i64,
    ) -> impl Future<Output = anyhow::Result<RowOutcome>> + Send;

    /// One delivery of message `message_id` to `consumer`'s inbox, in a new transaction on
    /// `conn`: a new message inserts a row in `orders` (its note the message id), enqueues one
    /// email on the claim (effect `ships-email`), completes the claim and commits.
    fn deliver(
        conn: &mut Self::Conn,
        consumer: &Consumer,
        message_id: &str,
    ) -> impl Future<Output = anyhow::Result<Delivery>> + Send;
}

/// What [`Driver::deliver`] came to.
#[derive(Debug)]
pub enum Delivery {
    /// The message was new: the handler ran, and these effects were written.
    New(Enqueued),
    /// The message was received before: nothing ran.
    Duplicate,
    /// txoutbox refused or failed (a concurrent delivery held the record: 409).
    Failed(Error),
}

/// The onward effect of every delivery: one email.
pub fn ships_email() -> anyhow::Result<OutboxMessage> {
    Ok(OutboxMessage::new(
        "email",
        &serde_json::json!({"to": "a@example.com", "subject": "your order ships"}),
    )?)
}
