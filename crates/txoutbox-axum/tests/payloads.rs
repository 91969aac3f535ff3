//! A handler that builds its effects with a sink crate's payload builder: `?` on a payload the
//! sink would refuse answers a 422 problem document, and nothing is written.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use txoutbox::Scope;
use txoutbox_axum::{problem_type, Idempotent, Problem, Started};
use txoutbox_test_support::http_client;
use txoutbox_test_support::serve_on_loopback;
use txoutbox_test_support::{test_db, TestDb};

#[derive(Clone)]
struct App {
    pool: deadpool_postgres::Pool,
    scope: Scope,
}

/// Signs a customer up and sends a welcome email built with `txoutbox_email::Email`.
async fn sign_up(State(app): State<App>, request: Idempotent) -> Result<Response, Problem> {
    let mut conn = app.pool.get().await?;
    let tx = conn.transaction().await?;
    let mut claim = match request.begin(&tx, &app.scope).await? {
        Started::New(claim) => claim,
        Started::Answered(answer) => return Ok(answer),
    };
    let body: Value = request.json()?;
    let email = body["email"].as_str().unwrap_or_default();
    tx.execute("INSERT INTO customers (email) VALUES ($1)", &[&email])
        .await?;
    let welcome = txoutbox_email::Email::new("Shop <shop@example.com>", email, "Welcome")
        .text("Thanks for signing up.")
        .into_outbox_message()?;
    claim.enqueue("welcome", welcome)?;
    // Raw JSON for another destination, checked as its sink will read it.
    let event = json!({"event_type": "customer.created", "data": {"email": email}});
    txoutbox_webhook::check(&event).map_err(txoutbox::Error::from)?;
    claim.enqueue("crm", txoutbox::OutboxMessage::new("webhook:crm", &event)?)?;
    request
        .complete(tx, claim, (StatusCode::CREATED, Json(json!({"ok": true}))))
        .await
}

async fn serve() -> anyhow::Result<(String, TestDb)> {
    let db = test_db().await?;
    db.connect()
        .await?
        .batch_execute("CREATE TABLE customers (id serial PRIMARY KEY, email text NOT NULL)")
        .await?;
    let app = App {
        pool: db.pool(4)?,
        scope: Scope::new("sign-ups")?,
    };
    let router = Router::new()
        .route("/customers", post(sign_up))
        .with_state(app);
    let (addr, _) = serve_on_loopback(router).await?;
    let base = format!("http://{addr}");
    Ok((base, db))
}

async fn sign_up_as(base: &str, email: &str) -> anyhow::Result<reqwest::Response> {
    let http = http_client()?;
    Ok(http
        .post(format!("{base}/customers"))
        .header("Idempotency-Key", uuid::Uuid::now_v7().to_string())
        .json(&json!({ "email": email }))
        .send()
        .await?)
}

async fn rows(db: &TestDb, table: &str) -> anyhow::Result<i64> {
    let client = db.connect().await?;
    Ok(client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0))
}

#[tokio::test]
async fn a_payload_the_sink_would_refuse_answers_a_422_problem_and_writes_nothing(
) -> anyhow::Result<()> {
    let (base, db) = serve().await?;
    let response = sign_up_as(&base, "ada@").await?;
    assert_eq!(response.status().as_u16(), 422);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await?;
    assert_eq!(problem["status"], 422);
    assert_eq!(problem["type"], problem_type("problem-invalid-payload"));
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("invalid to address \"ada@\""),
        "{problem}"
    );
    assert_eq!(rows(&db, "customers").await?, 0, "rolled back");
    assert_eq!(rows(&db, "txoutbox_messages").await?, 0);

    let response = sign_up_as(&base, "ada@example.org").await?;
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(rows(&db, "customers").await?, 1);
    assert_eq!(rows(&db, "txoutbox_messages").await?, 2);
    Ok(())
}
