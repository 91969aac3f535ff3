//! The crash matrix, with real processes: the service binary dies at each failure point of
//! `POST /charge`, restarts, and the client's retry with the same key gives one charge, one
//! PaymentIntent and one email.

use std::time::Duration;

use charge_service::{CrashPoint, ServiceProcess};
use txoutbox_test_support::{eventually_some, wait_until_for};

mod common;

async fn crash_at(point: CrashPoint) -> anyhow::Result<()> {
    let peers = common::Peers::start().await?;
    let (db, stripe, smtp) = (&peers.db, &peers.stripe, &peers.smtp);
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_charge-service"));
    let env = peers.env();
    let addr = charge_service::free_addr()?;
    let mut crashing = env.clone();
    crashing.push(("CRASH_AT".to_owned(), point.as_str().to_owned()));
    let mut server = ServiceProcess::start(exe, addr, &crashing, &[]).await?;

    let client = common::client(Duration::from_secs(45), Duration::from_secs(5))?;
    let operation = client.operation();
    let key = operation.key().to_owned();
    let url = format!("{}/charge", server.base_url());
    let request = {
        let (client, key, url) = (client.clone(), key.clone(), url.clone());
        tokio::spawn(async move {
            client
                .operation_with_key(key)
                .post_json(&url, &common::charge_body("cus_crash"))
                .await
        })
    };
    let status = server.wait_exit(Duration::from_secs(20)).await?;
    assert!(
        !status.success(),
        "the service should have aborted at {point:?}"
    );
    let server = ServiceProcess::start(exe, addr, &env, &[]).await?;
    let outcome = request.await??;
    common::assert_created(&outcome);
    assert!(
        outcome.attempts >= 2,
        "the first attempt died with the server"
    );
    let answer: serde_json::Value = outcome.json()?;

    // The relay (in the restarted process) delivers; the hook marks the charge.
    let pool = db.pool(2)?;
    eventually_some("the charge marked succeeded", || async {
        let succeeded = common::count(
            &pool,
            "SELECT count(*) FROM charges WHERE status = 'succeeded'",
        )
        .await?;
        Ok((succeeded == 1).then_some(()))
    })
    .await?;
    let row = pool
        .get()
        .await?
        .query_one(
            "SELECT id, status, payment_key, stripe_id FROM charges",
            &[],
        )
        .await?; // exactly one row, or query_one fails
    assert_eq!(
        common::count(&pool, "SELECT count(*) FROM charges").await?,
        1
    );
    let id: uuid::Uuid = row.get(0);
    assert_eq!(
        answer["charge_id"],
        id.to_string(),
        "the client saw the stored charge"
    );
    assert_eq!(row.get::<_, String>(1), "succeeded");
    let payment_key: String = row.get(2);

    assert_eq!(stripe.intents().len(), 1, "one PaymentIntent at Stripe");
    assert_eq!(
        row.get::<_, Option<String>>(3).as_deref(),
        stripe.intents()[0]["id"].as_str()
    );
    let keys: Vec<_> = stripe
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/payment_intents")
        .map(|r| r.idempotency_key)
        .collect();
    assert!(
        !keys.is_empty()
            && keys
                .iter()
                .all(|k| k.as_deref() == Some(payment_key.as_str()))
    );

    let mail = smtp.wait_for_messages(1, Duration::from_secs(20)).await?;
    // Once its row is delivered no attempt of the receipt is left to send a second copy.
    wait_until_for(&*pool.get().await?, "email", |c| c.delivered == 1).await?;
    assert_eq!(smtp.messages()?.len(), 1, "one receipt email: {mail:?}");

    // A later retry of the same operation is the same answer.
    let again = client
        .operation_with_key(key)
        .post_json(&url, &common::charge_body("cus_crash"))
        .await?;
    assert!(again.replayed());
    assert_eq!(again.json::<serde_json::Value>()?, answer);
    drop(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn crash_after_business_write_then_retry_charges_once() -> anyhow::Result<()> {
    crash_at(CrashPoint::AfterBusinessWrite).await
}

#[tokio::test(flavor = "multi_thread")]
async fn crash_before_commit_then_retry_charges_once() -> anyhow::Result<()> {
    crash_at(CrashPoint::BeforeCommit).await
}

#[tokio::test(flavor = "multi_thread")]
async fn crash_after_commit_then_retry_replays_the_one_charge() -> anyhow::Result<()> {
    crash_at(CrashPoint::AfterCommit).await
}
