//! What the write path's tests send: keys, fingerprints, and a database with a business table.

use anyhow::Result;
use tokio_postgres::Client;
use txoutbox::{Fingerprint, IdempotencyKey};

use crate::{test_db, TestDb};

/// A test key: `s`, padded with `-` to the 16 characters a scope requires by default.
pub fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::parse(&format!("{s:-<16}")).expect("test keys are valid")
}

/// The fingerprint of a `POST /charge` of `amount`.
pub fn charge_fingerprint(amount: i64) -> Fingerprint {
    Fingerprint::new(
        "POST",
        "/charge",
        format!(r#"{{"amount":{amount}}}"#).as_bytes(),
    )
}

/// Begins the request of key `k` that the test knows to be new (or expired): its claim. Fails
/// when [`begin`](txoutbox::begin) answers anything else.
pub async fn new_claim(
    tx: impl txoutbox::WriteTx,
    scope: &txoutbox::Scope,
    k: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Result<txoutbox::Claim> {
    match txoutbox::begin(tx, scope, k, fingerprint).await? {
        txoutbox::Begin::New(claim) => Ok(claim),
        other => anyhow::bail!("the key {} is not new: {other:?}", k.as_str()),
    }
}

/// A `201 Created` with no header and an empty body: the stored answer of a request whose
/// answer the test does not look at.
pub fn empty_created() -> txoutbox::StoredResponse {
    empty_answer(201)
}

/// An answer of `status` with no header and an empty body.
pub fn empty_answer(status: u16) -> txoutbox::StoredResponse {
    txoutbox::StoredResponse {
        status,
        headers: vec![],
        body: vec![],
    }
}

/// A test database with the business table of [`create_orders`], and a connection to it.
pub async fn db_with_orders() -> Result<(TestDb, Client)> {
    let db = test_db().await?;
    let client = db.connect().await?;
    create_orders(&client).await?;
    Ok((db, client))
}

/// Creates the business table `orders (id bigserial, note text)`.
pub async fn create_orders(client: &Client) -> Result<()> {
    client
        .batch_execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL)")
        .await?;
    Ok(())
}

/// Creates the business table `charges`, whose rows carry their own idempotency key (`UNIQUE`)
/// and request fingerprint: the table of a `BusinessKey` (`txoutbox::idempotency`).
pub async fn create_charges(client: &Client) -> Result<()> {
    client
        .batch_execute(
            "CREATE TABLE charges (id bigserial PRIMARY KEY, amount bigint NOT NULL, \
             idempotency_key text NOT NULL UNIQUE, request_fingerprint bytea NOT NULL)",
        )
        .await?;
    Ok(())
}

/// Runs `request` on `n` connections of their own at once (the tasks wait on a barrier, then go
/// together), and gives back every answer, in the order the tasks were started.
pub async fn at_once<T, F, Fut>(db: &TestDb, n: usize, request: F) -> Result<Vec<T>>
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (barrier, request) = (barrier.clone(), request(db.connect().await?));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            request.await
        }));
    }
    let mut answers = Vec::with_capacity(n);
    for task in tasks {
        answers.push(task.await?);
    }
    Ok(answers)
}

/// Stores the key `k` of the scope `charges`, completed, as a request of a txoutbox before V5
/// did: by inserting its row, without the key's advisory lock.
pub async fn store_key_without_the_lock(client: &Client, k: &IdempotencyKey) -> Result<()> {
    client
        .execute(
            "INSERT INTO txoutbox_idempotency_keys (scope, key, fingerprint, state, \
                 response_status, response_headers, response_body, expires_at) \
             VALUES ('charges', $1, '\\x00', 'completed', 201, '[]', '', now() + interval '1 day')",
            &[&k.as_str()],
        )
        .await?;
    Ok(())
}

/// Enqueues `messages` through the library's write path in a transaction of their own, and
/// commits it, as a service's request does.
pub async fn enqueue_committed(
    client: &mut Client,
    messages: &[txoutbox::OutboxMessage],
) -> Result<()> {
    let tx = client.transaction().await?;
    txoutbox::enqueue(&tx, messages).await?;
    tx.commit().await?;
    Ok(())
}

/// The stored answer of the one request among `answers` that did the work (a 201); every other
/// answer must be that stored response replayed, or a 409 (a concurrent holder of the key).
pub fn the_one_that_did_the_work(answers: &[txoutbox::StoredResponse]) -> txoutbox::StoredResponse {
    let stored = answers
        .iter()
        .find(|a| a.status == 201)
        .expect("one request did the work")
        .clone();
    for answer in answers {
        assert!(
            *answer == stored || answer.status == 409,
            "every answer is the stored response or 409, got {answer:?}"
        );
    }
    stored
}
