//! The retry loop against real local servers that fail on purpose.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use txoutbox_client::{sf_string, ClientError, IdempotentClient, RetryPolicy};

/// The keys of every request seen, and the answers to give the first ones.
#[derive(Clone, Default)]
struct Script {
    keys: Arc<Mutex<Vec<String>>>,
    failures: Arc<Mutex<Vec<StatusCode>>>,
    slow_first: bool,
}

async fn handler(State(script): State<Script>, headers: HeaderMap) -> axum::response::Response {
    use axum::response::IntoResponse;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let n = {
        let mut keys = script.keys.lock().expect("lock");
        keys.push(key);
        keys.len()
    };
    if script.slow_first && n == 1 {
        // Slower than any attempt timeout: the first call is never answered.
        std::future::pending::<()>().await;
    }
    let failure = {
        let mut failures = script.failures.lock().expect("lock");
        (!failures.is_empty()).then(|| failures.remove(0))
    };
    match failure {
        Some(status) => (status, [("retry-after", "0")], "try again").into_response(),
        None => (StatusCode::CREATED, format!("{{\"call\":{n}}}")).into_response(),
    }
}

async fn serve(script: Script) -> anyhow::Result<String> {
    serve_router(Router::new().route("/op", post(handler)).with_state(script)).await
}

/// Serves `router` on a free loopback port; the URL of its `/op`.
async fn serve_router(router: Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/op", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(url)
}

/// The URL of a server answering from `script`, and a client with the [`quick`] policy.
async fn scripted(script: &Script) -> anyhow::Result<(String, IdempotentClient)> {
    Ok((
        serve(script.clone()).await?,
        IdempotentClient::new(quick())?,
    ))
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        deadline: Duration::from_secs(5),
        attempt_timeout: Duration::from_millis(500),
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        max_attempts: 20,
    }
}

#[tokio::test]
async fn retries_5xx_and_409_with_the_same_key_until_an_answer() -> anyhow::Result<()> {
    let script = Script::default();
    *script.failures.lock().expect("lock") = vec![
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::CONFLICT,
        StatusCode::INTERNAL_SERVER_ERROR,
    ];
    let (url, client) = scripted(&script).await?;
    let outcome = client
        .operation()
        .post_json(&url, &serde_json::json!({"a": 1}))
        .await?;
    assert_eq!(outcome.status, StatusCode::CREATED);
    assert_eq!(outcome.attempts, 4);
    let keys = script.keys.lock().expect("lock").clone();
    assert_eq!(keys.len(), 4);
    assert!(keys.iter().all(|k| k == &sf_string(&outcome.key)));
    Ok(())
}

#[tokio::test]
async fn the_key_travels_as_an_sf_string_with_quote_and_backslash_escaped() -> anyhow::Result<()> {
    let script = Script::default();
    let (url, client) = scripted(&script).await?;
    let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    client.operation_with_key(uuid).post_json(&url, &1).await?;
    client
        .operation_with_key(r#"order"42\a"#)
        .post_json(&url, &1)
        .await?;
    let keys = script.keys.lock().expect("lock").clone();
    assert_eq!(
        keys,
        [format!("\"{uuid}\""), r#""order\"42\\a""#.to_owned()]
    );
    Ok(())
}

#[tokio::test]
async fn a_timed_out_attempt_is_retried_with_the_same_key() -> anyhow::Result<()> {
    let script = Script {
        slow_first: true,
        ..Script::default()
    };
    let (url, client) = scripted(&script).await?;
    let outcome = client.operation().post_json(&url, &1).await?;
    assert_eq!(outcome.status, StatusCode::CREATED);
    assert_eq!(outcome.attempts, 2);
    let keys = script.keys.lock().expect("lock").clone();
    let sent = sf_string(&outcome.key);
    assert_eq!(keys, vec![sent.clone(), sent]);
    Ok(())
}

#[tokio::test]
async fn dropped_connections_are_retried_with_the_same_key() -> anyhow::Result<()> {
    // A raw server: the first two connections are closed after the request arrives, with no answer.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/op", listener.local_addr()?);
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen_by_server = seen.clone();
    tokio::spawn(async move {
        let mut served = 0;
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let Ok(n) = socket.read(&mut buf).await else {
                continue;
            };
            let request = String::from_utf8_lossy(&buf[..n]).to_lowercase();
            let key = request
                .lines()
                .find_map(|l| l.strip_prefix("idempotency-key: "))
                .unwrap_or("")
                .trim()
                .to_owned();
            seen_by_server.lock().expect("lock").push(key);
            served += 1;
            if served <= 2 {
                drop(socket);
                continue;
            }
            let _ = socket
                .write_all(
                    b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                )
                .await;
        }
    });
    let client = IdempotentClient::new(quick())?;
    let outcome = client.operation().post_json(&url, &1).await?;
    assert_eq!(outcome.status, StatusCode::CREATED);
    assert_eq!(outcome.attempts, 3);
    let keys = seen.lock().expect("lock").clone();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| k == &sf_string(&outcome.key)));
    Ok(())
}

#[tokio::test]
async fn a_409_without_retry_after_is_a_final_business_answer() -> anyhow::Result<()> {
    let router = Router::new().route(
        "/op",
        post(|| async { (StatusCode::CONFLICT, "out of stock") }),
    );
    let url = serve_router(router).await?;
    let client = IdempotentClient::new(quick())?;
    let outcome = client.operation().post_json(&url, &1).await?;
    assert_eq!(outcome.status, StatusCode::CONFLICT);
    assert_eq!(outcome.attempts, 1);
    Ok(())
}

#[tokio::test]
async fn a_4xx_answer_is_final() -> anyhow::Result<()> {
    let script = Script::default();
    *script.failures.lock().expect("lock") = vec![StatusCode::UNPROCESSABLE_ENTITY];
    let (url, client) = scripted(&script).await?;
    let outcome = client.operation().post_json(&url, &1).await?;
    assert_eq!(outcome.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(outcome.attempts, 1);
    assert_eq!(script.keys.lock().expect("lock").len(), 1);
    Ok(())
}

#[tokio::test]
async fn gives_up_at_the_deadline_with_the_key_to_resume() -> anyhow::Result<()> {
    let script = Script::default();
    *script.failures.lock().expect("lock") = vec![StatusCode::SERVICE_UNAVAILABLE; 1000];
    let url = serve(script.clone()).await?;
    // 1 000 attempts at 5-50 ms apart would take far longer than the deadline: the client
    // stops at the deadline, not at its attempt count, and not before the deadline is near (the
    // last pause would have crossed it).
    let policy = RetryPolicy {
        deadline: Duration::from_millis(800),
        max_attempts: 1000,
        ..quick()
    };
    let client = IdempotentClient::new(policy)?;
    let operation = client.operation();
    let started = Instant::now();
    let err = operation
        .post_json(&url, &1)
        .await
        .expect_err("503 forever");
    assert!(
        started.elapsed() >= Duration::from_millis(750),
        "gave up {:?} after the start, before the deadline was near",
        started.elapsed()
    );
    match err {
        ClientError::GaveUp {
            attempts,
            key,
            last_status,
            ..
        } => {
            assert!(
                attempts > 1 && attempts < 1000,
                "{attempts} attempts: the deadline, not the attempt count, ended the retries"
            );
            assert_eq!(key, operation.key());
            assert_eq!(last_status, Some(StatusCode::SERVICE_UNAVAILABLE));
        }
        other => panic!("unexpected {other}"),
    }
    Ok(())
}

#[tokio::test]
async fn each_operation_has_its_own_key_and_a_resumed_one_keeps_it() -> anyhow::Result<()> {
    let client = IdempotentClient::new(quick())?;
    let a = client.operation();
    let b = client.operation();
    assert_ne!(a.key(), b.key());
    assert_eq!(client.operation_with_key(a.key()).key(), a.key());
    Ok(())
}
