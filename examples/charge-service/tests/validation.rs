//! Client errors over real HTTP: every invalid charge is a 400/413 problem document, never a 5xx
//! that a client would retry, and `IdempotentClient` does not retry it.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use txoutbox_test_support::counts;

mod common;

/// Bodies the service must refuse, with why.
fn invalid_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let with = |field: &str, value: Value| {
        let mut body = common::charge_body("cus_1");
        body[field] = value;
        body.to_string().into_bytes()
    };
    let without = |field: &str| {
        let mut body = common::charge_body("cus_1");
        if let Some(object) = body.as_object_mut() {
            object.remove(field);
        }
        body.to_string().into_bytes()
    };
    vec![
        ("a zero amount", with("amount", json!(0))),
        ("a negative amount", with("amount", json!(-1500))),
        (
            "an amount over Stripe's limit",
            with("amount", json!(100_000_000)),
        ),
        ("an amount over i64", with("amount", json!(u64::MAX))),
        ("a fractional amount", with("amount", json!(15.5))),
        ("an amount as a string", with("amount", json!("1500"))),
        (
            "a NUL in customer_id",
            with("customer_id", json!("cus\u{0}1")),
        ),
        (
            "a NUL in email",
            with("email", json!("ada\u{0}@example.org")),
        ),
        ("a NUL in currency", with("currency", json!("e\u{0}r"))),
        ("a blank customer_id", with("customer_id", json!("  "))),
        (
            "a currency that is no code",
            with("currency", json!("euro")),
        ),
        (
            "an email that is no address",
            with("email", json!("not an address")),
        ),
        ("a customer_id as a number", with("customer_id", json!(42))),
        ("a missing amount", without("amount")),
        ("a missing email", without("email")),
        ("an array", b"[1,2]".to_vec()),
        ("no JSON at all", b"amount=1500".to_vec()),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_charges_are_400_problem_documents_and_write_nothing() -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    let http = charge_service::reqwest_client()?;
    for (what, body) in invalid_bodies() {
        let answer = http
            .post(format!("{}/charge", server.base))
            .header("Idempotency-Key", uuid::Uuid::now_v7().to_string())
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = answer.status();
        assert_eq!(
            answer.headers()["content-type"],
            "application/problem+json",
            "{what}"
        );
        let problem: Value = answer.json().await?;
        assert_eq!(status, 400, "{what}: {problem}");
        assert_eq!(problem["status"], 400, "{what}");
    }
    assert_eq!(
        common::count(&server.pool, "SELECT count(*) FROM charges").await?,
        0
    );
    assert_eq!(
        counts(&*server.pool.get().await?).await?.keys,
        0,
        "a refused request leaves no key: the corrected retry runs"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_limit_is_a_413_problem_document() -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    let http = charge_service::reqwest_client()?;
    let mut body = common::charge_body("cus_1");
    body["customer_id"] = json!("x".repeat(charge_service::MAX_BODY_BYTES));
    let answer = http
        .post(format!("{}/charge", server.base))
        .header("Idempotency-Key", uuid::Uuid::now_v7().to_string())
        .json(&body)
        .send()
        .await?;
    assert_eq!(answer.status(), 413);
    assert_eq!(answer.headers()["content-type"], "application/problem+json");
    let problem: Value = answer.json().await?;
    assert_eq!(problem["status"], 413);
    assert_eq!(
        problem["type"],
        txoutbox_axum::problem_type("problem-body-too-large")
    );
    assert_eq!(problem["title"], "Content Too Large");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_idempotent_client_does_not_retry_a_refused_charge() -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    let client = common::client(Duration::from_secs(10), Duration::from_secs(5))?;
    let url = format!("{}/charge", server.base);
    let mut oversized = common::charge_body("cus_1");
    oversized["email"] = json!("x".repeat(charge_service::MAX_BODY_BYTES));
    let mut cases = invalid_bodies();
    cases.push(("a body over the limit", oversized.to_string().into_bytes()));
    for (what, body) in cases {
        let outcome = client
            .operation()
            .send(Method::POST, &url, body.into())
            .await?;
        assert!(
            outcome.status.is_client_error(),
            "{what}: {}",
            outcome.status
        );
        assert_eq!(outcome.attempts, 1, "{what}: a client error is final");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nul_in_a_reservations_item_id_is_a_400_problem_document() -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    let http = charge_service::reqwest_client()?;
    let answer = http
        .post(format!("{}/inventory/lamp%00/reservations", server.base))
        .header("Idempotency-Key", uuid::Uuid::now_v7().to_string())
        .json(&json!({"quantity": 1}))
        .send()
        .await?;
    assert_eq!(answer.status(), 400);
    assert_eq!(answer.headers()["content-type"], "application/problem+json");
    let problem: Value = answer.json().await?;
    assert_eq!(problem["type"], "urn:charge-service:invalid-reservation");
    Ok(())
}
