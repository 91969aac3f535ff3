//! `txoutbox-axum`'s `Idempotent` in a handler whose transaction is sqlx's, over real HTTP: the
//! answers a client sees (201, the replay marked `Idempotent-Replayed: true`, 400, 409, 413,
//! 422, 503) and one business row and one set of effects per key.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use txoutbox::{OutboxMessage, Scope};
use txoutbox_axum::{Idempotent, Problem, Started};
use txoutbox_test_support::http_client;
use txoutbox_test_support::post_json_with_key;
use txoutbox_test_support::request::db_with_orders;
use txoutbox_test_support::serve_on_loopback;
use txoutbox_test_support::{count, ConnInfo};

#[derive(Clone)]
struct App {
    pool: sqlx::PgPool,
    scope: Scope,
}

/// `POST /orders` on sqlx: the row, an email and a webhook effect, the answer stored with the key.
async fn create_order(State(app): State<App>, request: Idempotent) -> Result<Response, Problem> {
    let mut tx = app.pool.begin().await?;
    let mut claim = match request.begin(&mut tx, &app.scope).await? {
        Started::New(claim) => claim,
        Started::Answered(answer) => return Ok(answer),
    };
    let body: Value = request.json()?;
    let id: i64 = sqlx::query_scalar("INSERT INTO orders (note) VALUES ($1) RETURNING id")
        .bind(body.to_string())
        .fetch_one(&mut *tx)
        .await?;
    claim.enqueue("email", OutboxMessage::new("email", &json!({"order": id}))?)?;
    claim.enqueue(
        "webhook",
        OutboxMessage::new("webhook", &json!({"order": id}))?,
    )?;
    let answer = (StatusCode::CREATED, Json(json!({"order_id": id})));
    request.complete(tx, claim, answer).await
}

struct Server {
    base: String,
    http: reqwest::Client,
}

impl Server {
    async fn post(&self, key: Option<&str>, body: &Value) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}/orders", self.base);
        post_json_with_key(&self.http, &url, key, body).await
    }
}

async fn pool(db: &ConnInfo) -> anyhow::Result<sqlx::PgPool> {
    let options = sqlx::postgres::PgConnectOptions::new()
        .host(db.host())
        .port(db.port())
        .username(db.user())
        .database(db.dbname());
    let options = match db.password() {
        Some(password) => options.password(password),
        None => options,
    };
    Ok(sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options))
}

async fn serve(pool: sqlx::PgPool) -> anyhow::Result<Server> {
    let app = App {
        pool,
        scope: Scope::new("orders")?.with_lock_timeout(Duration::from_millis(100))?,
    };
    let router = Router::new()
        .route("/orders", post(create_order))
        .with_state(app);
    let (addr, _) = serve_on_loopback(router).await?;
    let base = format!("http://{addr}");
    Ok(Server {
        base,
        http: http_client()?,
    })
}

const KEY: &str = "3f1c1f7e-2b1e-4a53-9a43-7c3c0f1e9d11";

#[tokio::test]
async fn a_retry_on_sqlx_replays_the_answer_marked_replayed() -> anyhow::Result<()> {
    let (db, client) = db_with_orders().await?;
    let s = serve(pool(db.info()).await?).await?;
    let first = s.post(Some(KEY), &json!({"amount": 1200})).await?;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_body = first.text().await?;
    let again = s.post(Some(KEY), &json!({"amount": 1200})).await?;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await?, first_body);
    assert_eq!(count(&client, "orders").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 2);
    Ok(())
}

#[tokio::test]
async fn the_problems_on_sqlx_are_those_of_tokio_postgres() -> anyhow::Result<()> {
    let (db, client) = db_with_orders().await?;
    let s = serve(pool(db.info()).await?).await?;
    assert_eq!(
        s.post(Some(KEY), &json!({"amount": 1})).await?.status(),
        201
    );
    // Another request under the key: 422.
    assert_eq!(
        s.post(Some(KEY), &json!({"amount": 2})).await?.status(),
        422
    );
    // No key: 400.
    assert_eq!(s.post(None, &json!({"amount": 1})).await?.status(), 400);
    // A body over axum's limit: 413.
    let big = json!({"note": "x".repeat(3 * 1024 * 1024)});
    assert_eq!(s.post(Some(KEY), &big).await?.status(), 413);
    // A key another transaction holds past the lock timeout: 409.
    let held_key = "7d0c3b2a-0c8e-4a43-8b57-5b8e1f7c2a90";
    let mut holder = db.connect().await?;
    let held = holder.transaction().await?;
    let fingerprint = txoutbox::Fingerprint::new("POST", "/orders", b"{}");
    let key = txoutbox::IdempotencyKey::parse(held_key)?;
    let begun = txoutbox::begin(&held, &Scope::new("orders")?, &key, &fingerprint).await?;
    assert!(matches!(begun, txoutbox::Begin::New(_)));
    let conflict = s.post(Some(held_key), &json!({"amount": 3})).await?;
    assert_eq!(conflict.status(), 409);
    assert!(conflict.headers().get("retry-after").is_some());
    held.rollback().await?;
    assert_eq!(count(&client, "orders").await?, 1);
    Ok(())
}

#[tokio::test]
async fn an_unreachable_postgres_on_sqlx_is_503_with_retry_after() -> anyhow::Result<()> {
    let port = txoutbox_test_support::free_port()?;
    let nowhere = ConnInfo::tcp("127.0.0.1", port, "nobody", None, "nothing");
    let s = serve(pool(&nowhere).await?).await?;
    let response = s.post(Some(KEY), &json!({"amount": 1})).await?;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    Ok(())
}

#[tokio::test]
async fn fifty_concurrent_requests_on_sqlx_make_one_order_and_one_set_of_effects(
) -> anyhow::Result<()> {
    let (db, client) = db_with_orders().await?;
    let s = std::sync::Arc::new(serve(pool(db.info()).await?).await?);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.post(Some(KEY), &json!({"amount": 5}))
                .await
                .map(|r| r.status())
        }));
    }
    for task in tasks {
        let status = task.await??;
        assert!(status == 201 || status == 409, "{status}");
    }
    assert_eq!(count(&client, "orders").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 2);
    Ok(())
}

/// `POST /webhooks` on sqlx: `SignedWebhook::receive(&mut tx)` opens the inbox in a sqlx
/// transaction; the onward effect is enqueued on the claim with `complete(&mut tx)`.
async fn receive_webhook(
    State(pool): State<sqlx::PgPool>,
    hook: txoutbox_axum::SignedWebhook,
) -> Result<Response, Problem> {
    let mut tx = pool.begin().await?;
    let mut claim = match hook.receive(&mut tx).await? {
        txoutbox_axum::Received::New(claim) => claim,
        txoutbox_axum::Received::Duplicate(answer) => return Ok(answer),
    };
    sqlx::query("INSERT INTO orders (note) VALUES ($1)")
        .bind(hook.id())
        .execute(&mut *tx)
        .await?;
    claim.enqueue(
        "email",
        OutboxMessage::new("email", &json!({"id": hook.id()}))?,
    )?;
    claim.complete(&mut tx).await?;
    tx.commit().await?;
    Ok(axum::response::IntoResponse::into_response(
        StatusCode::NO_CONTENT,
    ))
}

#[tokio::test]
async fn a_signed_webhook_on_sqlx_is_applied_once_and_its_redelivery_is_a_duplicate(
) -> anyhow::Result<()> {
    use txoutbox::standard_webhooks::{sign, unix_seconds, WebhookSecret};
    let (db, client) = db_with_orders().await?;
    let secret = WebhookSecret::from_bytes(b"a shared secret of the endpoint".to_vec())?;
    let receiver = txoutbox_axum::WebhookReceiver::new(
        txoutbox::inbox::Consumer::new("orders-hook")?,
        secret.clone(),
    );
    #[derive(Clone)]
    struct Hooks {
        pool: sqlx::PgPool,
        receiver: txoutbox_axum::WebhookReceiver,
    }
    impl axum::extract::FromRef<Hooks> for sqlx::PgPool {
        fn from_ref(h: &Hooks) -> Self {
            h.pool.clone()
        }
    }
    impl axum::extract::FromRef<Hooks> for txoutbox_axum::WebhookReceiver {
        fn from_ref(h: &Hooks) -> Self {
            h.receiver.clone()
        }
    }
    let router = Router::new()
        .route("/webhooks", post(receive_webhook))
        .with_state(Hooks {
            pool: pool(db.info()).await?,
            receiver,
        });
    let (addr, _) = serve_on_loopback(router).await?;
    let url = format!("http://{addr}/webhooks");
    let (id, body) = ("msg_2aBcDe", br#"{"type":"order.paid"}"#);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let now = unix_seconds(std::time::SystemTime::now());
        let response = http_client()?
            .post(&url)
            .header("webhook-id", id)
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", sign(&secret, id, now, body))
            .body(body.to_vec())
            .send()
            .await?;
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [204, 200, 200]);
    assert_eq!(count(&client, "orders").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 1);
    assert_eq!(count(&client, "txoutbox_inbox").await?, 1);
    Ok(())
}
