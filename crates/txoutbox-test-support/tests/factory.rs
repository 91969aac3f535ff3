//! The row factory and the shared arrangement helpers, against a real Postgres.

use std::time::Duration;

use txoutbox::admin::MessageStatus;
use txoutbox_test_support::factory::message;
use txoutbox_test_support::webhook::WebhookReceiver;
use txoutbox_test_support::{counts, test_db_with_client};

type TestResult = anyhow::Result<()>;

#[tokio::test]
async fn a_message_is_created_in_the_state_asked_for() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let id = message(&db)
        .destination("x")
        .key("k-1")
        .ordering_key("order-1")
        .status(MessageStatus::Failed)
        .attempts(3)
        .last_error("declined")
        .created_ago(Duration::from_secs(3600))
        .create()
        .await?;
    let row = client
        .query_one(
            "SELECT destination, downstream_key, ordering_key, status, attempts, last_error, \
                 created_at < now() - interval '59 minutes', payload \
             FROM txoutbox_messages WHERE id = $1",
            &[&id],
        )
        .await?;
    assert_eq!(row.get::<_, String>(0), "x");
    assert_eq!(row.get::<_, String>(1), "k-1");
    assert_eq!(row.get::<_, Option<String>>(2).as_deref(), Some("order-1"));
    assert_eq!(row.get::<_, String>(3), "failed");
    assert_eq!(row.get::<_, i32>(4), 3);
    assert_eq!(row.get::<_, Option<String>>(5).as_deref(), Some("declined"));
    assert!(row.get::<_, bool>(6));
    assert_eq!(
        row.get::<_, serde_json::Value>(7),
        serde_json::json!({ "key": "k-1" })
    );
    Ok(())
}

#[tokio::test]
async fn many_messages_are_pending_under_numbered_keys() -> TestResult {
    let (_db, mut client) = test_db_with_client().await?;
    let ids = message(&mut client)
        .destination("email")
        .key("bulk")
        .payload_with(|_, i| serde_json::json!({ "n": i }))
        .create_many(1200)
        .await?;
    assert_eq!(ids.len(), 1200);
    assert_eq!(counts(&client).await?.pending, 1200);
    let rows = client
        .query(
            "SELECT status, downstream_key, payload->>'n' FROM txoutbox_messages",
            &[],
        )
        .await?;
    assert_eq!(rows.len(), 1200);
    for row in rows {
        let (status, key, n): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        assert_eq!((status.as_str(), key), ("pending", format!("bulk-{n}")));
    }
    Ok(())
}

#[tokio::test]
async fn the_webhook_receiver_answers_from_its_script() -> TestResult {
    let (receiver, addr) = WebhookReceiver::failing_first(&[("flaky", 1)]).await?;
    let http = post(addr, "flaky").await?;
    assert_eq!(http, 503);
    assert_eq!(post(addr, "flaky").await?, 200);
    assert_eq!(receiver.delivered("flaky"), 1);
    assert_eq!(receiver.seen().len(), 2);
    Ok(())
}

/// A bodiless `POST /{path}` over a plain TCP stream; the status.
async fn post(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!(
                "POST /{path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\
                 Connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0))
}
