//! `POST /orders` and `GET /orders/{id}` over real HTTP, on a real Postgres through sqlx: the
//! answers a client sees and the rows each leaves.

use std::sync::Arc;

use serde_json::{json, Value};
use txoutbox_test_support::{count, counts_for};

mod common;

use common::LocalService;

/// Asserts `response` is a problem document of `status`, and gives back the document.
async fn problem(response: reqwest::Response, status: u16) -> anyhow::Result<Value> {
    assert_eq!(response.status(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let document: Value = response.json().await?;
    assert_eq!(document["status"], status);
    Ok(document)
}

/// One order row, with its email and its webhook waiting in the outbox.
async fn one_order_one_email_one_webhook(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    assert_eq!(count(client, "orders").await?, 1);
    assert_eq!(counts_for(client, "email").await?.hot(), 1);
    assert_eq!(counts_for(client, "webhook").await?.hot(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_is_one_row_one_email_and_one_webhook_in_the_outbox() -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    let created = s.orders.post(&common::key(), &common::order()).await?;
    assert_eq!(created.status(), 201);
    assert!(created.headers().get("idempotent-replayed").is_none());
    let location = created.headers()["location"].to_str()?.to_owned();
    let body: Value = created.json().await?;
    let id = body["order_id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(location, format!("/orders/{id}"));

    let shown = s.orders.get(&id).await?;
    assert_eq!(shown.status(), 200);
    let shown: Value = shown.json().await?;
    assert_eq!(shown["order_id"], id);
    assert_eq!(shown["customer_id"], "cus_1");
    assert_eq!(shown["amount"], 1200);
    assert_eq!(shown["email"], "a@example.com");

    one_order_one_email_one_webhook(&s.client).await?;
    let row = s
        .client
        .query_one(
            "SELECT payload FROM txoutbox_messages WHERE destination = 'webhook'",
            &[],
        )
        .await?;
    let payload: Value = row.get(0);
    assert_eq!(payload["event_type"], "order.created");
    assert_eq!(payload["data"]["order_id"], id);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_key_twice_is_one_order_and_a_replay_of_the_same_body() -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    let key = common::key();
    let first = s.orders.post(&key, &common::order()).await?;
    assert_eq!(first.status(), 201);
    let location = first.headers()["location"].clone();
    let first_body = first.bytes().await?;

    let again = s.orders.post(&key, &common::order()).await?;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], location);
    assert_eq!(again.bytes().await?, first_body);

    one_order_one_email_one_webhook(&s.client).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_key_with_another_body_is_a_422_and_writes_nothing() -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    let key = common::key();
    assert_eq!(s.orders.post(&key, &common::order()).await?.status(), 201);
    let mut other = common::order();
    other["amount"] = json!(9900);
    problem(s.orders.post(&key, &other).await?, 422).await?;
    assert_eq!(count(&s.client, "orders").await?, 1);
    assert_eq!(count(&s.client, "txoutbox_messages").await?, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_requests_with_one_key_make_one_order_and_one_set_of_effects(
) -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    let key = Arc::new(common::key());
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (orders, key, barrier) = (s.orders.clone(), key.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            let response = orders.post(&key, &common::order()).await?;
            let status = response.status().as_u16();
            let replayed = response.headers().contains_key("idempotent-replayed");
            anyhow::Ok((status, replayed, response.bytes().await?))
        });
    }
    let (mut fresh, mut bodies) = (0, std::collections::HashSet::new());
    while let Some(answer) = tasks.join_next().await {
        let (status, replayed, body) = answer??;
        match status {
            201 => {
                fresh += usize::from(!replayed);
                bodies.insert(body);
            }
            // The key held past the scope's lock timeout: retry later, nothing was written.
            409 => {}
            other => panic!("{other}: {}", String::from_utf8_lossy(&body)),
        }
    }
    assert_eq!(fresh, 1, "one request did the work, the others replayed it");
    assert_eq!(bodies.len(), 1, "every 201 is the same answer");
    one_order_one_email_one_webhook(&s.client).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_order_is_a_422_problem_and_writes_nothing() -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    let cases = [
        (
            "a zero amount",
            json!({"customer_id": "c", "amount": 0, "email": "a@example.com"}),
        ),
        (
            "a negative amount",
            json!({"customer_id": "c", "amount": -5, "email": "a@example.com"}),
        ),
        (
            "an amount past i64",
            json!({"customer_id": "c", "amount": 1e30, "email": "a@example.com"}),
        ),
        (
            "an amount past the maximum",
            json!({"customer_id": "c", "amount": orders_sqlx::MAX_AMOUNT + 1, "email": "a@example.com"}),
        ),
        (
            "an amount as text",
            json!({"customer_id": "c", "amount": "12", "email": "a@example.com"}),
        ),
        (
            "not an address",
            json!({"customer_id": "c", "amount": 1, "email": "nobody"}),
        ),
        (
            "an address without a domain",
            json!({"customer_id": "c", "amount": 1, "email": "bob@"}),
        ),
        (
            "a NUL in the address",
            json!({"customer_id": "c", "amount": 1, "email": "a\u{0}@example.com"}),
        ),
        (
            "a NUL in the customer",
            json!({"customer_id": "c\u{0}", "amount": 1, "email": "a@example.com"}),
        ),
        (
            "a blank customer",
            json!({"customer_id": "  ", "amount": 1, "email": "a@example.com"}),
        ),
        (
            "a customer past 255 bytes",
            json!({"customer_id": "c".repeat(256), "amount": 1, "email": "a@example.com"}),
        ),
        ("no email", json!({"customer_id": "c", "amount": 1})),
    ];
    for (what, body) in cases {
        let document = problem(s.orders.post(&common::key(), &body).await?, 422).await?;
        assert_eq!(document["type"], "urn:orders-sqlx:invalid-order", "{what}");
    }
    assert_eq!(count(&s.client, "orders").await?, 0);
    assert_eq!(count(&s.client, "txoutbox_messages").await?, 0);
    assert_eq!(count(&s.client, "txoutbox_idempotency_keys").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_is_not_json_is_a_400_problem() -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    for body in [
        &b"customer_id=cus_1"[..],
        b"",
        b"{\"amount\": 12",
        b"\xff\xfe\x00",
    ] {
        problem(s.orders.post_raw(&common::key(), body.to_vec()).await?, 400).await?;
    }
    assert_eq!(count(&s.client, "orders").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_without_a_key_is_a_400_problem() -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    let response = s
        .orders
        .http
        .post(format!("{}/orders", s.orders.base))
        .json(&common::order())
        .send()
        .await?;
    problem(response, 400).await?;
    assert_eq!(count(&s.client, "orders").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_order_is_a_404_problem() -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    let unknown = uuid::Uuid::now_v7().to_string();
    let document = problem(s.orders.get(&unknown).await?, 404).await?;
    assert_eq!(document["type"], "about:blank");
    problem(s.orders.get("not-a-uuid").await?, 404).await?;
    problem(s.orders.get("%00").await?, 404).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_limit_is_a_413_problem() -> anyhow::Result<()> {
    let s = LocalService::start().await?;
    let mut big = common::order();
    big["customer_id"] = json!("c".repeat(orders_sqlx::MAX_BODY_BYTES));
    problem(s.orders.post(&common::key(), &big).await?, 413).await?;
    assert_eq!(count(&s.client, "orders").await?, 0);
    Ok(())
}
