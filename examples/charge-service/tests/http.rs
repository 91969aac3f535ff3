//! The service over real HTTP: many clients retrying at once, the last item, a Postgres outage.

use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};
use txoutbox_test_support::{counts, Cluster, ClusterOptions};

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn two_hundred_clients_retrying_make_one_charge_each() -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    let url = format!("{}/charge", server.base);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let url = url.clone();
        tasks.spawn(async move {
            let (tight, lose_answer) = {
                let mut rng = rand::rng();
                (rng.random_bool(0.3), rng.random_bool(0.4))
            };
            // Some clients time out before the server answers: their answers are dropped and the
            // request is cut off mid-transaction; they retry with the same key.
            let attempt_timeout = if tight {
                Duration::from_millis(3)
            } else {
                Duration::from_secs(5)
            };
            let first = common::client(Duration::from_secs(60), attempt_timeout)?;
            let operation = first.operation();
            let body = common::charge_body(&format!("cus_{i}"));
            let outcome = match operation.post_json(&url, &body).await {
                Ok(outcome) => outcome,
                // A 3 ms budget may never be enough under load: carry on with a patient client.
                Err(_) => {
                    common::client(Duration::from_secs(60), Duration::from_secs(5))?
                        .operation_with_key(operation.key())
                        .post_json(&url, &body)
                        .await?
                }
            };
            anyhow::ensure!(
                outcome.status == 201,
                "{}",
                String::from_utf8_lossy(&outcome.body)
            );
            let answer: Value = outcome.json()?;
            if lose_answer {
                // As if the 201 was lost on the way: the same key again.
                let again = common::client(Duration::from_secs(60), Duration::from_secs(5))?
                    .operation_with_key(operation.key())
                    .post_json(&url, &body)
                    .await?;
                anyhow::ensure!(again.replayed(), "a retry after a success is a replay");
                anyhow::ensure!(
                    again.json::<Value>()? == answer,
                    "the replay is the same answer"
                );
            }
            anyhow::Ok(answer["charge_id"].as_str().unwrap_or_default().to_owned())
        });
    }
    let mut ids = std::collections::HashSet::new();
    while let Some(result) = tasks.join_next().await {
        ids.insert(result??);
    }
    assert_eq!(ids.len(), 200, "200 operations, 200 distinct charges");
    assert_eq!(
        common::count(&server.pool, "SELECT count(*) FROM charges").await?,
        200
    );
    assert_eq!(
        counts(&*server.pool.get().await?).await?.hot(),
        400,
        "one PaymentIntent row and one email row per charge"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn twenty_buyers_of_the_last_item_make_one_reservation() -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    server
        .pool
        .get()
        .await?
        .execute(
            "INSERT INTO inventory (item_id, available) VALUES ('lamp', 1)",
            &[],
        )
        .await?;
    let url = format!("{}/inventory/lamp/reservations", server.base);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let url = url.clone();
        tasks.spawn(async move {
            let client = common::client(Duration::from_secs(30), Duration::from_secs(10))?;
            let operation = client.operation();
            let outcome = operation.post_json(&url, &json!({"quantity": 1})).await?;
            anyhow::Ok((operation.key().to_owned(), outcome))
        });
    }
    let mut won = 0;
    let mut refused = None;
    while let Some(result) = tasks.join_next().await {
        let (key, outcome) = result??;
        match outcome.status.as_u16() {
            201 => won += 1,
            409 => {
                let body: Value = outcome.json()?;
                assert_eq!(body["type"], "urn:charge-service:insufficient-stock");
                assert_eq!(body["available"], 0);
                refused = Some((key, body));
            }
            other => panic!(
                "unexpected {other}: {}",
                String::from_utf8_lossy(&outcome.body)
            ),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(
        common::count(&server.pool, "SELECT count(*) FROM reservations").await?,
        1
    );
    assert_eq!(
        common::count(&server.pool, "SELECT available::bigint FROM inventory").await?,
        0
    );
    // The refusal is a stored business outcome: the same key is told the same, even with stock.
    server
        .pool
        .get()
        .await?
        .execute("UPDATE inventory SET available = 5", &[])
        .await?;
    let (key, body) = refused.expect("19 refusals");
    let client = common::client(Duration::from_secs(10), Duration::from_secs(5))?;
    let again = client
        .operation_with_key(key)
        .post_json(&url, &json!({"quantity": 1}))
        .await?;
    assert_eq!(again.status, 409);
    assert!(again.replayed());
    assert_eq!(again.json::<Value>()?, body);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_down_is_503_and_the_retry_after_it_is_back_charges_once() -> anyhow::Result<()> {
    let cluster = Cluster::private(&ClusterOptions::default())?;
    let pg = cluster.admin().config()?;
    let server = common::local_server(&pg).await?;
    let url = format!("{}/charge", server.base);
    let http = charge_service::reqwest_client()?;
    let key = uuid::Uuid::now_v7().to_string();
    let body = common::charge_body("cus_outage");

    // Warm the pool, then take Postgres away under it.
    let up = http
        .get(format!("{}/charges/{}", server.base, uuid::Uuid::nil()))
        .send()
        .await?;
    assert_eq!(up.status(), 404);
    cluster.stop()?;
    let down = http
        .post(&url)
        .header("Idempotency-Key", &key)
        .json(&body)
        .send()
        .await?;
    assert_eq!(down.status(), 503);
    assert_eq!(down.headers()["retry-after"], "1");
    assert_eq!(down.headers()["content-type"], "application/problem+json");
    let problem: Value = down.json().await?;
    assert_eq!(problem["status"], 503);
    // Why is for the service's log; the client is told when to retry.
    assert_eq!(
        problem["detail"],
        "the store is unavailable; retry after 1 s"
    );

    // The client keeps retrying the same key while Postgres comes back.
    let client = common::client(Duration::from_secs(30), Duration::from_secs(5))?;
    let retry = {
        let (client, key, url, body) = (client.clone(), key.clone(), url.clone(), body.clone());
        tokio::spawn(async move { client.operation_with_key(key).post_json(&url, &body).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.start()?;
    let outcome = retry.await??;
    common::assert_created(&outcome);
    assert!(outcome.attempts >= 2, "the first attempts met the outage");
    let again = client
        .operation_with_key(key)
        .post_json(&url, &body)
        .await?;
    assert!(again.replayed());
    assert_eq!(
        common::count(&server.pool, "SELECT count(*) FROM charges").await?,
        1
    );
    Ok(())
}

/// Charges once with `key`, lets the key's window pass (and prunes it when `prune`), then sends
/// the same request with the same key again: it must be a new charge with new downstream keys.
async fn the_same_key_after_its_window(prune: bool) -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    let http = charge_service::reqwest_client()?;
    let url = format!("{}/charge", server.base);
    let key = uuid::Uuid::now_v7().to_string();
    let body = common::charge_body("cus_again");
    let post = || {
        http.post(&url)
            .header("Idempotency-Key", &key)
            .json(&body)
            .send()
    };
    let first = post().await?;
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await?;
    let conn = server.pool.get().await?;
    // The old PaymentIntent was declined and dead-lettered; then the window passes.
    conn.execute(
        "UPDATE txoutbox_messages SET status = 'failed' WHERE destination = 'stripe'",
        &[],
    )
    .await?;
    conn.execute(
        "UPDATE txoutbox_idempotency_keys SET expires_at = now() - interval '1 second'",
        &[],
    )
    .await?;
    if prune {
        assert_eq!(txoutbox::admin::prune_expired_keys(&conn, 10).await?, 1);
    }
    let second = post().await?;
    let status = second.status();
    let second: Value = second.json().await?;
    assert_eq!(
        status, 201,
        "a request after the window is a new charge: {second}"
    );
    assert_ne!(second["charge_id"], first["charge_id"]);
    assert_eq!(
        common::count(&server.pool, "SELECT count(*) FROM charges").await?,
        2
    );
    assert_eq!(
        common::count(
            &server.pool,
            "SELECT count(DISTINCT downstream_key) FROM txoutbox_messages WHERE destination = 'stripe'"
        )
        .await?,
        2,
        "the new charge's PaymentIntent is enqueued with a key of its own"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_reused_after_its_window_is_a_new_charge() -> anyhow::Result<()> {
    the_same_key_after_its_window(false).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_reused_after_its_window_and_pruned_is_a_new_charge() -> anyhow::Result<()> {
    the_same_key_after_its_window(true).await
}
