//! The drivers under test: tokio-postgres, deadpool and sqlx, each running the suite's requests
//! through txoutbox's public API as a service on that driver would.

use anyhow::Result;
use sqlx::{Connection, Row};
use tokio_postgres::types::Type;
use txoutbox::idempotency::{BusinessKey, RowBegin};
use txoutbox::{Begin, Claim, Error, IdempotencyKey, OutboxMessage, Scope};
use txoutbox_test_support::ConnInfo;

use txoutbox::inbox::{self, Consumer, Receive};

use crate::{ships_email, Delivery, Driver, Finish, Outcome, Request, RowOutcome};

/// The business insert of every request.
const INSERT_ORDER: &str = "INSERT INTO orders (note) VALUES ($1)";

/// The `BusinessKey` of the suite: the service's `charges` rows are their requests' key records.
fn charges() -> Result<BusinessKey> {
    Ok(BusinessKey::new(
        Scope::new("charges")?,
        "SELECT * FROM charges WHERE idempotency_key = $1",
        "request_fingerprint",
    ))
}

/// The `BusinessKey` insert.
const INSERT_CHARGE: &str = "INSERT INTO charges (amount, idempotency_key, request_fingerprint) \
     VALUES ($1, $2, $3) ON CONFLICT (idempotency_key) DO NOTHING RETURNING *";

/// The effect a `BusinessKey` request enqueues.
fn receipt() -> Result<OutboxMessage> {
    Ok(OutboxMessage::new(
        "email",
        &serde_json::json!({"to": "a@example.com"}),
    )?)
}

/// The claim of a key `begin` found new, or what the request answers without doing the work.
fn new_claim(begun: txoutbox::Result<Begin>) -> std::result::Result<Claim, Outcome> {
    match begun {
        Ok(Begin::New(claim)) => Ok(claim),
        Ok(Begin::Replay(stored)) => Err(Outcome::Replay(stored)),
        Ok(Begin::Mismatch) => Err(Outcome::Mismatch),
        Ok(Begin::InFlight) => Err(Outcome::InFlight),
        Err(e) => Err(Outcome::Failed(e)),
    }
}

/// Runs a request on a tokio-postgres-shaped transaction (`tokio_postgres::Transaction` or
/// deadpool's): the two differ only in their types.
macro_rules! tokio_request {
    ($tx:ident, $request:ident) => {{
        if let Some(hook) = $request.after_begin.take() {
            hook()?;
        }
        let begun =
            txoutbox::begin(&$tx, &$request.scope, &$request.key, &$request.fingerprint).await;
        let mut claim = match new_claim(begun) {
            Ok(claim) => claim,
            Err(outcome) => return Ok(outcome),
        };
        $tx.execute(INSERT_ORDER, &[&$request.note]).await?;
        let response = $request.response();
        for (effect, message) in std::mem::take(&mut $request.effects) {
            claim.enqueue(&effect, message)?;
        }
        let enqueued = match $request.finish {
            Finish::ClaimCommit => claim.commit($tx, &response).await,
            Finish::CompleteThenCommit => match claim.complete(&$tx, &response).await {
                Ok(enqueued) => $tx.commit().await.map(|()| enqueued).map_err(Error::from),
                Err(e) => Err(e),
            },
            Finish::CompleteThenRollback => {
                let enqueued = claim.complete(&$tx, &response).await;
                $tx.rollback().await?;
                enqueued
            }
        };
        Ok(match enqueued {
            Ok(enqueued) => Outcome::New(enqueued),
            Err(e) => Outcome::Failed(e),
        })
    }};
}

/// The savepoint case on a tokio-postgres-shaped transaction.
macro_rules! tokio_commit_in_savepoint {
    ($outer:ident, $request:ident) => {{
        $outer.execute(INSERT_ORDER, &[&"outer"]).await?;
        let inner = $outer.transaction().await?;
        let begun = txoutbox::begin(
            &inner,
            &$request.scope,
            &$request.key,
            &$request.fingerprint,
        )
        .await?;
        let Begin::New(mut claim) = begun else {
            anyhow::bail!("a new key was expected");
        };
        inner.execute(INSERT_ORDER, &[&$request.note]).await?;
        for (effect, message) in std::mem::take(&mut $request.effects) {
            claim.enqueue(&effect, message)?;
        }
        let Err(refused) = claim.commit(inner, &$request.response()).await else {
            anyhow::bail!("Claim::commit committed in a savepoint");
        };
        // The outer transaction may be aborted already (tokio-postgres): its rollback's answer
        // does not matter, only that nothing is left.
        let _ = $outer.rollback().await;
        Ok(refused)
    }};
}

/// The `BusinessKey` case on a tokio-postgres-shaped transaction.
macro_rules! tokio_business {
    ($tx:ident, $key:ident, $amount:ident) => {{
        let fingerprint = txoutbox_test_support::request::charge_fingerprint($amount);
        let stored: &[u8] = fingerprint.as_bytes();
        let key_text = $key.as_str();
        let begun = charges()?
            .begin(
                &$tx,
                $key,
                &fingerprint,
                INSERT_CHARGE,
                &[
                    (&$amount, Type::INT8),
                    (&key_text, Type::TEXT),
                    (&stored, Type::BYTEA),
                ],
            )
            .await?;
        Ok(match begun {
            RowBegin::New { row, mut claim } => {
                claim.enqueue("receipt", receipt()?)?;
                claim.complete(&$tx).await?;
                $tx.commit().await?;
                RowOutcome::New(row.try_get("id")?)
            }
            RowBegin::Replay(row) => RowOutcome::Replay(row.try_get("id")?),
            RowBegin::Mismatch => RowOutcome::Mismatch,
            RowBegin::InFlight => RowOutcome::InFlight,
        })
    }};
}

/// A delivery to the inbox on a tokio-postgres-shaped transaction.
macro_rules! tokio_deliver {
    ($tx:ident, $consumer:ident, $message_id:ident) => {{
        let mut claim = match inbox::receive(&$tx, $consumer, $message_id).await {
            Ok(Receive::New(claim)) => claim,
            Ok(Receive::Duplicate { .. }) => return Ok(Delivery::Duplicate),
            Err(e) => return Ok(Delivery::Failed(e)),
        };
        $tx.execute(INSERT_ORDER, &[&$message_id]).await?;
        claim.enqueue("ships-email", ships_email()?)?;
        let enqueued = claim.complete(&$tx).await?;
        $tx.commit().await?;
        Ok(Delivery::New(enqueued))
    }};
}

/// A tokio-postgres-shaped driver's requests, each in a transaction of the client that
/// `$client` reaches from the connection `$conn`.
macro_rules! tokio_driver_requests {
    ($conn:ident => $client:expr) => {
        async fn request($conn: &mut Self::Conn, mut request: Request) -> Result<Outcome> {
            let tx = $client.transaction().await?;
            tokio_request!(tx, request)
        }

        async fn commit_in_savepoint(
            $conn: &mut Self::Conn,
            mut request: Request,
        ) -> Result<Error> {
            let mut outer = $client.transaction().await?;
            tokio_commit_in_savepoint!(outer, request)
        }

        async fn business_request(
            $conn: &mut Self::Conn,
            key: &IdempotencyKey,
            amount: i64,
        ) -> Result<RowOutcome> {
            let tx = $client.transaction().await?;
            tokio_business!(tx, key, amount)
        }

        async fn deliver(
            $conn: &mut Self::Conn,
            consumer: &Consumer,
            message_id: &str,
        ) -> Result<Delivery> {
            let tx = $client.transaction().await?;
            tokio_deliver!(tx, consumer, message_id)
        }
    };
}

/// tokio-postgres: `&tokio_postgres::Transaction` (unnamed statements, pipelined).
pub struct TokioPostgres;

impl Driver for TokioPostgres {
    type Conn = tokio_postgres::Client;

    async fn connect(db: &ConnInfo) -> Result<Self::Conn> {
        db.connect().await
    }

    tokio_driver_requests!(conn => conn);
}

/// deadpool: `&deadpool_postgres::Transaction` (prepared statements from the connection's
/// cache, pipelined).
pub struct Deadpool;

impl Driver for Deadpool {
    type Conn = (deadpool_postgres::Pool, deadpool_postgres::Object);

    async fn connect(db: &ConnInfo) -> Result<Self::Conn> {
        let pool = db.pool(1)?;
        let object = pool.get().await?;
        Ok((pool, object))
    }

    tokio_driver_requests!(conn => conn.1);
}

/// sqlx: `&mut sqlx::Transaction<'_, Postgres>` (prepared statements, one at a time).
pub struct Sqlx;

impl Driver for Sqlx {
    type Conn = sqlx::PgConnection;

    async fn connect(db: &ConnInfo) -> Result<Self::Conn> {
        let mut options = sqlx::postgres::PgConnectOptions::new()
            .port(db.port())
            .username(db.user())
            .database(db.dbname());
        options = if db.host().starts_with('/') {
            options.socket(db.host())
        } else {
            options.host(db.host())
        };
        if let Some(password) = db.password() {
            options = options.password(password);
        }
        Ok(sqlx::PgConnection::connect_with(&options).await?)
    }

    async fn request(conn: &mut Self::Conn, mut request: Request) -> Result<Outcome> {
        let mut tx = conn.begin().await?;
        if let Some(hook) = request.after_begin.take() {
            hook()?;
        }
        let begun =
            txoutbox::begin(&mut tx, &request.scope, &request.key, &request.fingerprint).await;
        let mut claim = match new_claim(begun) {
            Ok(claim) => claim,
            Err(outcome) => return Ok(outcome),
        };
        sqlx::query(INSERT_ORDER)
            .bind(&request.note)
            .execute(&mut *tx)
            .await?;
        let response = request.response();
        for (effect, message) in std::mem::take(&mut request.effects) {
            claim.enqueue(&effect, message)?;
        }
        let enqueued = match request.finish {
            Finish::ClaimCommit => claim.commit(tx, &response).await,
            Finish::CompleteThenCommit => match claim.complete(&mut tx, &response).await {
                Ok(enqueued) => tx.commit().await.map(|()| enqueued).map_err(Error::from),
                Err(e) => Err(e),
            },
            Finish::CompleteThenRollback => {
                let enqueued = claim.complete(&mut tx, &response).await;
                tx.rollback().await?;
                enqueued
            }
        };
        Ok(match enqueued {
            Ok(enqueued) => Outcome::New(enqueued),
            Err(e) => Outcome::Failed(e),
        })
    }

    async fn commit_in_savepoint(conn: &mut Self::Conn, mut request: Request) -> Result<Error> {
        let mut outer = conn.begin().await?;
        sqlx::query(INSERT_ORDER)
            .bind("outer")
            .execute(&mut *outer)
            .await?;
        let mut inner = outer.begin().await?;
        let begun = txoutbox::begin(
            &mut inner,
            &request.scope,
            &request.key,
            &request.fingerprint,
        )
        .await?;
        let Begin::New(mut claim) = begun else {
            anyhow::bail!("a new key was expected");
        };
        sqlx::query(INSERT_ORDER)
            .bind(&request.note)
            .execute(&mut *inner)
            .await?;
        for (effect, message) in std::mem::take(&mut request.effects) {
            claim.enqueue(&effect, message)?;
        }
        let Err(refused) = claim.commit(inner, &request.response()).await else {
            anyhow::bail!("Claim::commit committed in a savepoint");
        };
        outer.rollback().await?;
        Ok(refused)
    }

    async fn business_request(
        conn: &mut Self::Conn,
        key: &IdempotencyKey,
        amount: i64,
    ) -> Result<RowOutcome> {
        let fingerprint = txoutbox_test_support::request::charge_fingerprint(amount);
        let mut tx = conn.begin().await?;
        let insert = sqlx::query(INSERT_CHARGE)
            .bind(amount)
            .bind(key.as_str())
            .bind(fingerprint.as_bytes());
        let begun = charges()?
            .begin_sqlx(&mut tx, key, &fingerprint, insert)
            .await?;
        Ok(match begun {
            RowBegin::New { row, mut claim } => {
                claim.enqueue("receipt", receipt()?)?;
                claim.complete(&mut tx).await?;
                tx.commit().await?;
                RowOutcome::New(row.try_get("id")?)
            }
            RowBegin::Replay(row) => RowOutcome::Replay(row.try_get("id")?),
            RowBegin::Mismatch => RowOutcome::Mismatch,
            RowBegin::InFlight => RowOutcome::InFlight,
        })
    }

    async fn deliver(
        conn: &mut Self::Conn,
        consumer: &Consumer,
        message_id: &str,
    ) -> Result<Delivery> {
        let mut tx = conn.begin().await?;
        let mut claim = match inbox::receive(&mut tx, consumer, message_id).await {
            Ok(Receive::New(claim)) => claim,
            Ok(Receive::Duplicate { .. }) => return Ok(Delivery::Duplicate),
            Err(e) => return Ok(Delivery::Failed(e)),
        };
        sqlx::query(INSERT_ORDER)
            .bind(message_id)
            .execute(&mut *tx)
            .await?;
        claim.enqueue("ships-email", ships_email()?)?;
        let enqueued = claim.complete(&mut tx).await?;
        tx.commit().await?;
        Ok(Delivery::New(enqueued))
    }
}
