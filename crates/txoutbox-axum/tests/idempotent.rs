//! The extractor against a real Postgres, over real HTTP on 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_postgres::IsolationLevel;
use txoutbox::Scope;
use txoutbox_axum::{problem_type, Idempotent, Problem, Started};
use txoutbox_test_support::http_client;
use txoutbox_test_support::post_json_with_key;
use txoutbox_test_support::select::{column, value};
use txoutbox_test_support::serve_on_loopback;
use txoutbox_test_support::{counts, test_db, TestDb};

#[derive(Clone)]
struct App {
    pool: deadpool_postgres::Pool,
    scope: Scope,
    /// The handlers' transactions' isolation level (Postgres's default, READ COMMITTED, when
    /// `None`).
    isolation: Option<IsolationLevel>,
    /// Where a slow request waits, holding its key, until the test releases it.
    gate: Arc<Gate>,
}

/// A slow request says it holds its key (`entered`) and finishes once `release`d.
#[derive(Default)]
struct Gate {
    entered: Notify,
    release: Notify,
}

impl Gate {
    /// Sends `second` once the slow request holds its key, then lets the slow one finish.
    async fn while_held<T>(&self, second: impl std::future::Future<Output = T>) -> T {
        self.entered.notified().await;
        let answer = second.await;
        self.release.notify_one();
        answer
    }
}

async fn create_order(State(app): State<App>, request: Idempotent) -> Result<Response, Problem> {
    let mut conn = app.pool.get().await?;
    let mut builder = conn.build_transaction();
    if let Some(level) = app.isolation {
        builder = builder.isolation_level(level);
    }
    let tx = builder.start().await?;
    let mut claim = match request.begin(&tx, &app.scope).await? {
        Started::New(claim) => claim,
        Started::Answered(answer) => return Ok(answer),
    };
    let body: Value = request.json()?;
    let qty = body["quantity"].as_i64().unwrap_or(0);
    if qty > 10 {
        // A business outcome: stored and replayed like a success.
        let refusal = (
            StatusCode::CONFLICT,
            Json(json!({"error": "not enough stock"})),
        );
        return request.complete(tx, claim, refusal).await;
    }
    let row = tx
        .query_one(
            "INSERT INTO orders (quantity) VALUES ($1) RETURNING id",
            &[&qty],
        )
        .await?;
    let id: i32 = row.get(0);
    claim.enqueue(
        "email",
        txoutbox::OutboxMessage::new("email", &json!({"order": id}))?,
    )?;
    if body["slow"].as_bool() == Some(true) {
        app.gate.entered.notify_one();
        app.gate.release.notified().await;
    }
    if body["fail"].as_bool() == Some(true) {
        return request
            .complete(tx, claim, (StatusCode::INTERNAL_SERVER_ERROR, "boom"))
            .await;
    }
    let answer = (
        StatusCode::CREATED,
        [("x-order-id", id.to_string())],
        Json(json!({"order_id": id})),
    );
    request.complete(tx, claim, answer).await
}

/// Enqueues the day's digest under a key of its own: a second request (another idempotency key)
/// finds it already in the outbox, and answers what `Prepared::enqueued` says.
async fn send_digest(State(app): State<App>, request: Idempotent) -> Result<Response, Problem> {
    let mut conn = app.pool.get().await?;
    let tx = conn.transaction().await?;
    let mut claim = match request.begin(&tx, &app.scope).await? {
        Started::New(claim) => claim,
        Started::Answered(answer) => return Ok(answer),
    };
    let digest = txoutbox::OutboxMessage::new("email", &json!({"digest": "2026-12-03"}))?
        .with_downstream_key("digest-2026-12-03");
    claim.enqueue("digest", digest)?;
    // `prepare` writes the claim's rows with the answer; `enqueued` says which were written.
    let prepared = request
        .prepare(&tx, claim, (StatusCode::ACCEPTED, "queued"))
        .await?;
    let enqueued = prepared.enqueued().clone();
    prepared.commit(tx).await?;
    Ok(Json(json!({
        "written": enqueued.written().len(),
        "skipped": enqueued.skipped().len(),
    }))
    .into_response())
}

async fn count(State(app): State<App>, _request: Idempotent) -> Result<Response, Problem> {
    let conn = app.pool.get().await?;
    let n: i64 = conn
        .query_one("SELECT count(*) FROM orders", &[])
        .await?
        .get(0);
    Ok(Json(json!({"orders": n})).into_response())
}

struct Server {
    base: String,
    http: reqwest::Client,
    _db: Option<TestDb>,
    pool: deadpool_postgres::Pool,
    gate: Arc<Gate>,
}

async fn serve(pool: deadpool_postgres::Pool, db: Option<TestDb>) -> anyhow::Result<Server> {
    let gate = Arc::new(Gate::default());
    let app = App {
        pool: pool.clone(),
        scope: Scope::new("orders")?.with_lock_timeout(Duration::from_millis(200))?,
        isolation: None,
        gate: gate.clone(),
    };
    let serializable = App {
        pool: pool.clone(),
        scope: Scope::new("orders")?.with_lock_timeout(Duration::from_secs(5))?,
        isolation: Some(IsolationLevel::Serializable),
        gate: gate.clone(),
    };
    // A service whose clients send short keys of their own (ticket numbers) lowers the minimum.
    let tickets = App {
        pool: pool.clone(),
        scope: Scope::new("tickets")?.with_min_key_len(4)?,
        isolation: None,
        gate: gate.clone(),
    };
    let router = Router::new()
        .route("/orders", post(create_order).get(count))
        .route("/digests", post(send_digest))
        .with_state(app)
        .merge(
            Router::new()
                .route("/tickets", post(create_order))
                .with_state(tickets),
        )
        .merge(
            Router::new()
                .route("/serializable-orders", post(create_order))
                .with_state(serializable),
        );
    let (addr, _) = serve_on_loopback(router).await?;
    let base = format!("http://{addr}");
    let http = http_client()?;
    Ok(Server {
        base,
        http,
        _db: db,
        pool,
        gate,
    })
}

async fn server() -> anyhow::Result<Server> {
    let db = test_db().await?;
    db.connect()
        .await?
        .batch_execute("CREATE TABLE orders (id serial PRIMARY KEY, quantity bigint NOT NULL)")
        .await?;
    serve(db.pool(8)?, Some(db)).await
}

impl Server {
    async fn post(&self, key: Option<&str>, body: &Value) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}/orders", self.base);
        post_json_with_key(&self.http, &url, key, body).await
    }

    async fn orders(&self) -> anyhow::Result<i64> {
        let conn = self.pool.get().await?;
        Ok(conn
            .query_one("SELECT count(*) FROM orders", &[])
            .await?
            .get(0))
    }

    async fn outbox_rows(&self) -> anyhow::Result<i64> {
        Ok(counts(&*self.pool.get().await?).await?.hot())
    }
}

fn key() -> String {
    uuid::Uuid::now_v7().to_string()
}

async fn problem(response: reqwest::Response) -> anyhow::Result<Value> {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = response.json().await?;
    assert!(body["type"].is_string() && body["title"].is_string() && body["detail"].is_string());
    Ok(body)
}

/// Fails unless `response` is a problem of `status` and `kind` whose detail says `says`.
async fn expect_problem(
    response: reqwest::Response,
    status: u16,
    kind: &str,
    says: &str,
) -> anyhow::Result<()> {
    assert_eq!(response.status(), status);
    let body = problem(response).await?;
    assert_eq!(body["type"], problem_type(kind));
    assert!(detail(&body).contains(says), "{body}");
    Ok(())
}

#[tokio::test]
async fn retry_with_same_key_replays_status_headers_and_body() -> anyhow::Result<()> {
    let s = server().await?;
    let key = key();
    let first = s.post(Some(&key), &json!({"quantity": 2})).await?;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_id = first.headers()["x-order-id"].clone();
    let first_body: Value = first.json().await?;

    let again = s.post(Some(&key), &json!({"quantity": 2})).await?;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["x-order-id"], first_id);
    assert_eq!(again.headers()["content-type"], "application/json");
    assert_eq!(again.json::<Value>().await?, first_body);
    assert_eq!(s.orders().await?, 1);
    assert_eq!(s.outbox_rows().await?, 1);
    Ok(())
}

#[tokio::test]
async fn the_request_traceparent_is_stored_with_its_effects() -> anyhow::Result<()> {
    let s = server().await?;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for (key, header) in [
        ("traced-request-0001", traceparent),
        ("garbled-request-0001", "00-not-a-trace"),
    ] {
        let response = s
            .http
            .post(format!("{}/orders", s.base))
            .header("Idempotency-Key", key)
            .header("traceparent", header)
            .json(&json!({"quantity": 1}))
            .send()
            .await?;
        assert_eq!(response.status(), 201, "{header}");
    }
    let conn = s.pool.get().await?;
    let stored: Vec<Option<String>> = column(
        &**conn,
        "SELECT headers->>'traceparent' FROM txoutbox_messages ORDER BY seq",
    )
    .await?;
    // A malformed header is not forwarded to anyone, and does not fail the request.
    assert_eq!(stored, [Some(traceparent.to_owned()), None]);
    Ok(())
}

#[tokio::test]
async fn post_without_key_is_400_problem() -> anyhow::Result<()> {
    let s = server().await?;
    let response = s.post(None, &json!({"quantity": 1})).await?;
    assert_eq!(response.status(), 400);
    let body = problem(response).await?;
    assert_eq!(body["status"], 400);
    assert_eq!(s.orders().await?, 0);
    Ok(())
}

#[tokio::test]
async fn malformed_key_is_400_problem() -> anyhow::Result<()> {
    let s = server().await?;
    let response = s
        .post(Some(&"x".repeat(300)), &json!({"quantity": 1}))
        .await?;
    expect_problem(response, 400, "problem-malformed-key", "at most 255").await?;
    Ok(())
}

#[tokio::test]
async fn the_quoted_and_the_bare_spelling_of_a_key_make_one_effect() -> anyhow::Result<()> {
    let s = server().await?;
    let key = key();
    // The draft's form: an RFC 8941 sf-string.
    let quoted = s
        .post(Some(&format!("\"{key}\"")), &json!({"quantity": 2}))
        .await?;
    assert_eq!(quoted.status(), 201);
    let bare = s.post(Some(&key), &json!({"quantity": 2})).await?;
    assert_eq!(bare.status(), 201);
    assert_eq!(bare.headers()["idempotent-replayed"], "true");
    let quoted_again = s
        .post(Some(&format!("  \"{key}\"  ")), &json!({"quantity": 2}))
        .await?;
    assert_eq!(quoted_again.headers()["idempotent-replayed"], "true");
    assert_eq!(s.orders().await?, 1);
    assert_eq!(s.outbox_rows().await?, 1);
    let conn = s.pool.get().await?;
    let stored: String = value(&**conn, "SELECT key FROM txoutbox_idempotency_keys").await?;
    assert_eq!(stored, key, "the quotes are not part of the key");
    Ok(())
}

#[tokio::test]
async fn an_escaped_sf_string_is_unescaped_into_one_key() -> anyhow::Result<()> {
    let s = server().await?;
    let first = s
        .post(Some(r#""order\"42\\2026-12-03""#), &json!({"quantity": 1}))
        .await?;
    assert_eq!(first.status(), 201);
    let bare = s
        .post(Some(r#"order"42\2026-12-03"#), &json!({"quantity": 1}))
        .await?;
    assert_eq!(bare.headers()["idempotent-replayed"], "true");
    // `\n` is no sf-string escape.
    let refused = s
        .post(Some(r#""order\n42-2026-12-03""#), &json!({"quantity": 1}))
        .await?;
    expect_problem(
        refused,
        400,
        "problem-malformed-key",
        "not a valid sf-string",
    )
    .await?;
    assert_eq!(s.orders().await?, 1);
    Ok(())
}

#[tokio::test]
async fn two_idempotency_key_fields_are_a_400_problem() -> anyhow::Result<()> {
    let s = server().await?;
    let (a, b) = (key(), key());
    for (first, second) in [(a.clone(), b.clone()), (a.clone(), a.clone())] {
        let response = s
            .http
            .post(format!("{}/orders", s.base))
            .header("Idempotency-Key", format!("\"{first}\""))
            .header("Idempotency-Key", format!("\"{second}\""))
            .json(&json!({"quantity": 1}))
            .send()
            .await?;
        expect_problem(response, 400, "problem-multiple-keys", "exactly one").await?;
    }
    // One field holding a list is two keys as well.
    let list = s
        .post(Some(&format!("\"{a}\", \"{b}\"")), &json!({"quantity": 1}))
        .await?;
    expect_problem(list, 400, "problem-multiple-keys", "exactly one").await?;
    assert_eq!(s.orders().await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_key_shorter_than_16_characters_is_a_400_problem() -> anyhow::Result<()> {
    let s = server().await?;
    let response = s
        .post(Some("\"order-42\""), &json!({"quantity": 1}))
        .await?;
    expect_problem(response, 400, "problem-key-too-short", "at least 16").await?;
    assert_eq!(s.orders().await?, 0);
    // Sixteen characters are enough.
    let sixteen = s
        .post(Some("\"order-0000000042\""), &json!({"quantity": 1}))
        .await?;
    assert_eq!(sixteen.status(), 201);
    Ok(())
}

#[tokio::test]
async fn a_scope_that_lowers_the_minimum_accepts_short_keys() -> anyhow::Result<()> {
    let s = server().await?;
    let post = |key: &'static str| {
        s.http
            .post(format!("{}/tickets", s.base))
            .header("Idempotency-Key", key)
            .json(&json!({"quantity": 1}))
            .send()
    };
    assert_eq!(post("\"T-42\"").await?.status(), 201);
    assert_eq!(post("T-42").await?.headers()["idempotent-replayed"], "true");
    assert_eq!(post("T-4").await?.status(), 400);
    assert_eq!(s.orders().await?, 1);
    Ok(())
}

#[tokio::test]
async fn concurrent_duplicates_in_serializable_handlers_are_replays_or_409_never_500(
) -> anyhow::Result<()> {
    let s = server().await?;
    let key = format!("\"{}\"", key());
    let requests = (0..20).map(|_| {
        s.http
            .post(format!("{}/serializable-orders", s.base))
            .header("Idempotency-Key", &key)
            .json(&json!({"quantity": 1}))
            .send()
    });
    let mut statuses = Vec::new();
    for response in futures::future::join_all(requests).await {
        let response = response?;
        let status = response.status().as_u16();
        if status == 409 {
            assert_eq!(response.headers()["retry-after"], "1");
            problem(response).await?;
        }
        statuses.push(status);
    }
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 409),
        "only the stored answer or 409: {statuses:?}"
    );
    assert_eq!(s.orders().await?, 1);
    Ok(())
}

/// A problem's `detail`.
fn detail(body: &Value) -> &str {
    body["detail"].as_str().unwrap_or_default()
}

/// The status, `type`, `title` and `detail` of one problem answer (its content type checked).
async fn problem_kind(
    response: reqwest::Response,
) -> anyhow::Result<(u16, String, String, String)> {
    let status = response.status().as_u16();
    let body = problem(response).await?;
    assert_eq!(body["status"], status);
    let text = |field: &str| body[field].as_str().unwrap_or_default().to_owned();
    Ok((status, text("type"), text("title"), text("detail")))
}

#[tokio::test]
async fn by_default_a_problems_type_is_about_blank_titled_with_its_status_phrase(
) -> anyhow::Result<()> {
    let s = server().await?;
    let used = key();
    s.post(Some(&used), &json!({"quantity": 1})).await?;
    let busy = key();
    let slow = json!({"quantity": 1, "slow": true});
    let (_, in_flight) = tokio::join!(
        s.post(Some(&busy), &slow),
        s.gate.while_held(s.post(Some(&busy), &slow))
    );
    let too_large = s
        .http
        .post(format!("{}/orders", s.base))
        .header("Idempotency-Key", format!("\"{}\"", key()))
        .header("content-type", "application/json")
        .body(vec![b' '; 3 * 1024 * 1024])
        .send()
        .await?;
    let not_json = s
        .http
        .post(format!("{}/orders", s.base))
        .header("Idempotency-Key", format!("\"{}\"", key()))
        .body("{not json")
        .send()
        .await?;
    let seen = [
        problem_kind(s.post(None, &json!({})).await?).await?,
        problem_kind(
            s.post(Some("\"unterminated-0000000000"), &json!({}))
                .await?,
        )
        .await?,
        problem_kind(s.post(Some("short-key"), &json!({})).await?).await?,
        problem_kind(s.post(Some(&used), &json!({"quantity": 9})).await?).await?,
        problem_kind(in_flight?).await?,
        problem_kind(too_large).await?,
        problem_kind(not_json).await?,
    ];
    // No service here set a base: no `type` points to a page that does not exist, and the
    // detail says which problem it is.
    let expected = [
        (400, "Bad Request", "send an Idempotency-Key header"),
        (400, "Bad Request", "not a valid sf-string"),
        (400, "Bad Request", "at least 16"),
        (
            422,
            "Unprocessable Content",
            "already used for a different request",
        ),
        (409, "Conflict", "still being processed"),
        (413, "Content Too Large", "length limit"),
        (400, "Bad Request", "line 1"),
    ];
    for ((status, kind, title, detail), (want_status, want_title, said)) in
        seen.iter().zip(expected)
    {
        assert_eq!(*status, want_status, "{detail}");
        assert_eq!(kind, "about:blank", "{detail}");
        assert_eq!(title, want_title, "{detail}");
        assert!(detail.contains(said), "{detail:?} does not say {said:?}");
    }
    Ok(())
}

#[tokio::test]
async fn an_about_blank_problem_is_titled_with_the_rfc_9110_status_phrase() -> anyhow::Result<()> {
    let cases = [
        (StatusCode::UNPROCESSABLE_ENTITY, "Unprocessable Content"),
        (StatusCode::PAYLOAD_TOO_LARGE, "Content Too Large"),
        (StatusCode::NOT_FOUND, "Not Found"),
        (StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error"),
    ];
    for (status, phrase) in cases {
        let router = Router::new().route(
            "/",
            post(move || async move { Problem::blank(status, "detail") }),
        );
        let (addr, _) = serve_on_loopback(router).await?;
        let base = format!("http://{addr}");
        let response = http_client()?.post(&base).send().await?;
        assert_eq!(response.status(), status);
        let body = problem(response).await?;
        assert_eq!(body["type"], "about:blank");
        assert_eq!(body["title"], phrase);
        // The status line says it too, as curl shows it.
        assert_eq!(
            status_line(&base).await?,
            format!("HTTP/1.1 {} {phrase}", status.as_u16())
        );
    }
    Ok(())
}

/// The first line of the answer to a bare `POST /` at `base`, read off the socket.
async fn status_line(base: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(addr).await?;
    socket
        .write_all(
            b"POST / HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await?;
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    Ok(answer.lines().next().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn get_needs_no_key() -> anyhow::Result<()> {
    let s = server().await?;
    let response = s.http.get(format!("{}/orders", s.base)).send().await?;
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<Value>().await?, json!({"orders": 0}));
    Ok(())
}

#[tokio::test]
async fn same_key_for_another_request_is_422() -> anyhow::Result<()> {
    let s = server().await?;
    let key = key();
    assert_eq!(
        s.post(Some(&key), &json!({"quantity": 1})).await?.status(),
        201
    );
    let other = s.post(Some(&key), &json!({"quantity": 3})).await?;
    assert_eq!(other.status(), 422);
    problem(other).await?;
    assert_eq!(s.orders().await?, 1);
    Ok(())
}

#[tokio::test]
async fn same_key_while_first_is_running_is_409_with_retry_after() -> anyhow::Result<()> {
    let s = server().await?;
    let key = key();
    let body = json!({"quantity": 1, "slow": true});
    let (first, second) = tokio::join!(
        s.post(Some(&key), &body),
        s.gate.while_held(s.post(Some(&key), &body))
    );
    assert_eq!(first?.status(), 201);
    let second = second?;
    assert_eq!(second.status(), 409);
    assert_eq!(second.headers()["retry-after"], "1");
    problem(second).await?;
    assert_eq!(s.orders().await?, 1);
    Ok(())
}

#[tokio::test]
async fn server_error_rolls_back_so_the_retry_runs_again() -> anyhow::Result<()> {
    let s = server().await?;
    let key = key();
    let failing = s
        .post(Some(&key), &json!({"quantity": 1, "fail": true}))
        .await?;
    assert_eq!(failing.status(), 500);
    assert_eq!(s.orders().await?, 0);
    assert_eq!(s.outbox_rows().await?, 0);
    // The same key with the same body runs again (nothing was stored).
    let again = s
        .post(Some(&key), &json!({"quantity": 1, "fail": true}))
        .await?;
    assert_eq!(again.status(), 500);
    assert!(again.headers().get("idempotent-replayed").is_none());
    Ok(())
}

#[tokio::test]
async fn business_refusal_is_stored_and_replayed() -> anyhow::Result<()> {
    let s = server().await?;
    let key = key();
    let first = s.post(Some(&key), &json!({"quantity": 50})).await?;
    assert_eq!(first.status(), 409);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let again = s.post(Some(&key), &json!({"quantity": 50})).await?;
    assert_eq!(again.status(), 409);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(
        again.json::<Value>().await?,
        json!({"error": "not enough stock"})
    );
    Ok(())
}

/// A pool whose connections go, as `user` (and its password, if any), to a port nothing
/// listens on: connecting is refused at once; each wait is bounded to 2 s.
fn pool_of_nothing(user: &str) -> anyhow::Result<deadpool_postgres::Pool> {
    let port = txoutbox_test_support::free_port()?;
    let pg = txoutbox::pg::PgConfig::parse(&format!("postgres://{user}@127.0.0.1:{port}/nothing"))?;
    Ok(
        deadpool_postgres::Pool::builder(pg.manager(deadpool_postgres::ManagerConfig::default()))
            .max_size(2)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(Duration::from_secs(2)))
            .wait_timeout(Some(Duration::from_secs(2)))
            .build()?,
    )
}

#[tokio::test]
async fn unreachable_postgres_is_503_with_retry_after() -> anyhow::Result<()> {
    let s = serve(pool_of_nothing("nobody")?, None).await?;
    let response = s.post(Some(&key()), &json!({"quantity": 1})).await?;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body = problem(response).await?;
    assert_eq!(body["status"], 503);
    assert_eq!(body["type"], "about:blank");
    assert_eq!(body["title"], "Service Unavailable");
    Ok(())
}

#[tokio::test]
async fn a_503s_detail_says_when_to_retry_and_holds_no_driver_text() -> anyhow::Result<()> {
    let s = serve(pool_of_nothing("nobody:s3cret")?, None).await?;
    let response = s.post(Some(&key()), &json!({"quantity": 1})).await?;
    assert_eq!(response.status(), 503);
    let body = problem(response).await?;
    assert_eq!(
        detail(&body),
        "the store is unavailable; retry after 1 s",
        "{body}"
    );
    Ok(())
}

#[tokio::test]
async fn an_effect_already_in_the_outbox_is_reported_as_skipped() -> anyhow::Result<()> {
    let server = server().await?;
    let mut answers = Vec::new();
    for key in ["digest-request-0001", "digest-request-0002"] {
        let answer = server
            .http
            .post(format!("{}/digests", server.base))
            .header("Idempotency-Key", key)
            .json(&json!({}))
            .send()
            .await?;
        answers.push(answer.json::<Value>().await?);
    }
    assert_eq!(answers[0], json!({"written": 1, "skipped": 0}));
    assert_eq!(answers[1], json!({"written": 0, "skipped": 1}));
    assert_eq!(server.outbox_rows().await?, 1);
    Ok(())
}
