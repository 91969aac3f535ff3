//! The webhook sink against a real HTTP receiver (axum on 127.0.0.1), a real Postgres and the
//! real relay: signatures, retries with Retry-After, redelivery after a relay crash, dead letters.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio_postgres::Client;
use txoutbox::admin::AttemptOutcome;
use txoutbox::admin::MessageStatus::Delivered;
use txoutbox::sink::Sink;
use txoutbox_test_support::abort_after_a_call;
use txoutbox_test_support::raw_http::{closed_port, response, Behaviour, RawHttpServer};
use txoutbox_test_support::relay::{fail_raw_payload, short_lease, RunningRelay};
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::LoopbackServer;
use txoutbox_test_support::{
    counts, delivered_attempts, eventually_some, log_of, receipt_of, test_db, test_db_with_client,
    wait_for_key, wait_until,
};
use txoutbox_webhook::{verify, Webhook, WebhookConfig, WebhookSecret, WebhookSink};

type TestResult = anyhow::Result<()>;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const DESTINATION: &str = "webhook:orders";

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Seen {
    headers: HeaderMap,
    body: Bytes,
    at: Instant,
}

/// What the receiver answers to one request.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: &'static str,
    /// Never answers (a receiver slower than any timeout).
    hangs: bool,
}

impl Reply {
    fn status(status: u16) -> Self {
        Self {
            status,
            headers: vec![],
            body: "",
            hangs: false,
        }
    }

    fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.push((name, value));
        self
    }

    fn body(mut self, body: &'static str) -> Self {
        self.body = body;
        self
    }

    fn never(mut self) -> Self {
        self.hangs = true;
        self
    }
}

#[derive(Default)]
struct ReceiverState {
    seen: Mutex<Vec<Seen>>,
    script: Mutex<VecDeque<Reply>>,
}

/// A webhook receiver on 127.0.0.1: answers from a script (then 200 with an `x-request-id`),
/// recording every request. Stops when dropped.
struct Receiver {
    url: String,
    state: Arc<ReceiverState>,
    _server: LoopbackServer,
}

impl Receiver {
    async fn start(script: impl IntoIterator<Item = Reply>) -> anyhow::Result<Self> {
        let state = Arc::new(ReceiverState {
            seen: Mutex::new(Vec::new()),
            script: Mutex::new(script.into_iter().collect()),
        });
        let app = axum::Router::new()
            .route("/hooks/orders", axum::routing::post(receive))
            .with_state(state.clone());
        let server = LoopbackServer::start(app).await?;
        Ok(Self {
            url: format!("http://{}/hooks/orders", server.addr),
            state,
            _server: server,
        })
    }

    fn seen(&self) -> Vec<Seen> {
        self.state
            .seen
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Every request so far, once there are at least `n`.
    async fn wait_for(&self, n: usize) -> anyhow::Result<Vec<Seen>> {
        eventually_some(&format!("{n} requests at the receiver"), || async {
            let seen = self.seen();
            Ok((seen.len() >= n).then_some(seen))
        })
        .await
    }
}

async fn receive(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seen = Seen {
        headers,
        body,
        at: Instant::now(),
    };
    if let Ok(mut all) = state.seen.lock() {
        all.push(seen);
    }
    let reply = state.script.lock().ok().and_then(|mut s| s.pop_front());
    let reply = reply.unwrap_or_else(|| Reply::status(200).header("x-request-id", "req-1"));
    if reply.hangs {
        std::future::pending::<()>().await;
    }
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, reply.body).into_response();
    for (name, value) in reply.headers {
        if let Ok(value) = value.parse() {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn secret() -> WebhookSecret {
    WebhookSecret::parse(SECRET).expect("valid secret")
}

/// Enqueues one webhook for `DESTINATION` with downstream key `key`.
async fn enqueue_event(client: &mut Client, key: &str, traceparent: Option<&str>) -> TestResult {
    let event = Webhook::new("order.paid", serde_json::json!({ "order": 42 }));
    let mut message = event
        .into_outbox_message_for(DESTINATION)?
        .with_downstream_key(key);
    if let Some(tp) = traceparent {
        message = message.with_header("traceparent", tp);
    }
    enqueue_committed(client, &[message]).await?;
    Ok(())
}

fn header<'a>(seen: &'a Seen, name: &str) -> &'a str {
    seen.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A sink whose calls fit in [`short_lease`] (the relay refuses one whose timeout does not).
fn short_timeout(url: &str) -> anyhow::Result<WebhookSink> {
    let config = WebhookConfig {
        timeout: Duration::from_millis(500),
        ..WebhookConfig::default()
    };
    Ok(WebhookSink::with_config(url, secret(), config)?)
}

#[tokio::test]
async fn delivered_webhook_is_signed_verifiably_and_carries_the_downstream_key() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let receiver = Receiver::start([]).await?;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    enqueue_event(&mut client, "evt-1", Some(traceparent)).await?;

    let sink = WebhookSink::new(&receiver.url, secret())?;
    let relay = RunningRelay::start(db.relay()?.sink(DESTINATION, sink).build()?);
    let seen = receiver.wait_for(1).await?;
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(verify(&secret(), &request.headers, &request.body), Ok(()));
    assert_eq!(header(request, "webhook-id"), "evt-1");
    assert_eq!(header(request, "idempotency-key"), "evt-1");
    assert_eq!(header(request, "content-type"), "application/json");
    // The relay's attempt continues the enqueued trace as a span of its own.
    let forwarded = txoutbox::telemetry::Traceparent::parse(header(request, "traceparent"))?;
    assert_eq!(forwarded.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_ne!(forwarded.parent_id(), "00f067aa0ba902b7");
    let body: serde_json::Value = serde_json::from_slice(&request.body)?;
    assert_eq!(body["type"], "order.paid");
    assert_eq!(body["data"], serde_json::json!({ "order": 42 }));
    assert!(body["timestamp"].is_string());
    let other = WebhookSecret::from_bytes(b"not the endpoint's secret".to_vec())?;
    assert!(verify(&other, &request.headers, &request.body).is_err());

    wait_for_key(&client, "evt-1", Delivered).await?;
    assert_eq!(counts(&client).await?.delivered, 1);
    relay.stop().await?;
    assert_eq!(
        receipt_of(&client, "evt-1").await?.as_deref(),
        Some("HTTP 200; x-request-id: req-1")
    );
    Ok(())
}

#[tokio::test]
async fn a_503_with_retry_after_is_retried_after_that_delay_then_delivered() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    // The default backoff's first retry comes within 0.5 s: a gap of 1 s is the Retry-After's.
    let receiver =
        Receiver::start([Reply::status(503).header("retry-after", "1").body("busy")]).await?;
    enqueue_event(&mut client, "evt-2", None).await?;

    let sink = WebhookSink::new(&receiver.url, secret())?;
    let relay = RunningRelay::start(db.relay()?.sink(DESTINATION, sink).build()?);
    let seen = receiver.wait_for(2).await?;
    wait_until(&client, |c| c.delivered >= 1).await?;
    assert_eq!(delivered_attempts(&client).await?, [2]);
    relay.stop().await?;

    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(950) && gap < Duration::from_secs(5),
        "retried after {gap:?}, not after the 1 s the receiver asked for"
    );
    assert_eq!(
        header(&seen[0], "webhook-id"),
        header(&seen[1], "webhook-id")
    );
    for request in &seen {
        assert_eq!(verify(&secret(), &request.headers, &request.body), Ok(()));
    }
    let retries = log_of(&client, AttemptOutcome::Retry).await?;
    assert_eq!(retries.len(), 1, "{retries:?}");
    let error = retries[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("503") && error.contains("busy"), "{error}");
    Ok(())
}

#[tokio::test]
async fn a_redelivery_after_a_relay_crash_keeps_the_same_webhook_id() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let receiver = Receiver::start([]).await?;
    enqueue_event(&mut client, "evt-3", None).await?;

    abort_after_a_call(&db, DESTINATION, short_timeout(&receiver.url)?, |relay| {
        relay
    })
    .await?;

    let second = RunningRelay::start(
        db.relay()?
            .config(short_lease())
            .sink(DESTINATION, short_timeout(&receiver.url)?)
            .build()?,
    );
    let seen = receiver.wait_for(2).await?;
    wait_for_key(&client, "evt-3", Delivered).await?;
    assert_eq!(counts(&client).await?.delivered, 1);
    second.stop().await?;

    assert_eq!(seen.len(), 2, "the crashed attempt and the redelivery");
    assert_eq!(header(&seen[0], "webhook-id"), "evt-3");
    assert_eq!(header(&seen[1], "webhook-id"), "evt-3");
    assert_eq!(seen[0].body, seen[1].body, "the same event, byte for byte");
    assert_eq!(verify(&secret(), &seen[1].headers, &seen[1].body), Ok(()));
    Ok(())
}

#[tokio::test]
async fn a_400_is_dead_lettered_with_its_status_and_body() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let receiver = Receiver::start([Reply::status(400).body("unknown field: order")]).await?;
    enqueue_event(&mut client, "evt-4", None).await?;

    let sink = WebhookSink::new(&receiver.url, secret())?;
    let relay = RunningRelay::start(db.relay()?.sink(DESTINATION, sink).build()?);
    assert_eq!(wait_until(&client, |c| c.failed >= 1).await?.failed, 1);
    relay.stop().await?;

    assert_eq!(
        receiver.seen().len(),
        1,
        "a permanent failure is not retried"
    );
    let row = client
        .query_one("SELECT attempts, last_error FROM txoutbox_messages", &[])
        .await?;
    let (attempts, error): (i32, String) = (row.get(0), row.get(1));
    assert_eq!(attempts, 1);
    assert!(
        error.contains("400") && error.contains("unknown field: order"),
        "{error}"
    );
    Ok(())
}

#[tokio::test]
async fn a_raw_payload_of_the_wrong_shape_is_dead_lettered_naming_the_builder() -> TestResult {
    let db = test_db().await?;
    let receiver = Receiver::start([Reply::status(200)]).await?;
    // The Standard Webhooks body's shape, not the payload's: `type` where `event_type` belongs.
    let raw = serde_json::json!({ "type": "contact.created", "data": { "id": 7 } });
    let sink = WebhookSink::new(&receiver.url, secret())?;
    let error = fail_raw_payload(&db, DESTINATION, &raw, txoutbox_webhook::check, sink).await?;
    assert!(receiver.seen().is_empty(), "nothing was sent");
    assert!(
        error.starts_with("malformed payload (build it with txoutbox_webhook::Webhook): ")
            && error.contains("event_type"),
        "{error}"
    );
    Ok(())
}

#[tokio::test]
async fn a_receiver_slower_than_the_timeout_is_retried() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let receiver = Receiver::start([Reply::status(200).never()]).await?;
    enqueue_event(&mut client, "evt-5", None).await?;

    let config = WebhookConfig {
        timeout: Duration::from_millis(300),
        ..WebhookConfig::default()
    };
    let sink = WebhookSink::with_config(&receiver.url, secret(), config)?;
    let relay = RunningRelay::start(db.relay()?.sink(DESTINATION, sink).build()?);
    wait_until(&client, |c| c.delivered >= 1).await?;
    assert_eq!(delivered_attempts(&client).await?, [2]);
    relay.stop().await?;

    let retries = log_of(&client, AttemptOutcome::Retry).await?;
    assert_eq!(retries.len(), 1, "{retries:?}");
    let error = retries[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("timed out"), "{error}");
    Ok(())
}

/// One delivery of an event, as the relay would hand it to the sink.
fn delivery(key: &str) -> anyhow::Result<txoutbox::sink::Delivery> {
    let event = Webhook::new("order.paid", serde_json::json!({ "order": 42 }));
    Ok(txoutbox::sink::Delivery {
        id: uuid::Uuid::now_v7(),
        destination: DESTINATION.to_owned(),
        payload: serde_json::to_value(&event)?,
        headers: Default::default(),
        downstream_key: key.to_owned(),
        ordering_key: None,
        attempt: 1,
        created_at: chrono::Utc::now(),
    })
}

/// The sink's answer to one delivery against `url`, with a short timeout.
async fn deliver_to(url: &str, timeout: Duration) -> anyhow::Result<txoutbox::sink::DeliveryError> {
    let config = WebhookConfig {
        timeout,
        ..WebhookConfig::default()
    };
    let sink = WebhookSink::with_config(url, secret(), config)?;
    match sink.deliver(&delivery("evt-hostile")?).await {
        Ok(receipt) => anyhow::bail!("delivered: {receipt:?}"),
        Err(e) => Ok(e),
    }
}

/// The text of `e`, which must be retryable, checked clean: no NUL, no control character, 2 KiB
/// at the most.
fn retryable_clean_text(e: &txoutbox::sink::DeliveryError) -> String {
    assert!(
        matches!(e, txoutbox::sink::DeliveryError::Retryable { .. }),
        "{e:?}"
    );
    let message = e.to_string();
    assert!(!message.contains('\0'), "a NUL byte: {message:?}");
    assert!(
        !message.chars().any(char::is_control),
        "a control character: {message:?}"
    );
    assert!(
        message.len() <= 2048,
        "{} bytes of error text",
        message.len()
    );
    message
}

#[tokio::test]
async fn an_error_body_with_nul_bytes_and_invalid_utf8_becomes_clean_bounded_text() -> TestResult {
    let mut body = b"upstream\0failed \xff\xfe\xc3(".to_vec();
    body.extend(std::iter::repeat_n(0u8, 4096));
    let server = RawHttpServer::start(Behaviour::Answer(response(500, &[], &body))).await?;

    let e = deliver_to(&server.url("/hooks"), Duration::from_secs(5)).await?;
    let message = retryable_clean_text(&e);
    assert!(message.contains("500"), "{message}");
    assert!(message.contains("upstream"), "{message}");
    assert!(
        message.ends_with(&format!("({} bytes)", body.len())),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn an_endless_error_body_is_not_read_to_its_end() -> TestResult {
    // 10 MB announced, and the server writes for as long as the client reads.
    const ANNOUNCED: u64 = 10 * 1024 * 1024;
    let head = format!("HTTP/1.1 503 Unavailable\r\ncontent-length: {ANNOUNCED}\r\n\r\n");
    let chunk = vec![0u8; 64 * 1024];
    let server = RawHttpServer::start(Behaviour::Endless {
        head: head.into_bytes(),
        chunk,
    })
    .await?;

    let e = deliver_to(&server.url("/hooks"), Duration::from_secs(60)).await?;
    let message = retryable_clean_text(&e);
    assert!(
        message.ends_with(&format!("({ANNOUNCED} bytes)")),
        "{message}"
    );
    // The sink read an excerpt and closed: the server wrote a fraction of the body before its
    // writes were refused, and the client cannot have read more than was written. (A hang
    // guard, not a bound on speed: a sink that never closes fails here.)
    let written = tokio::time::timeout(
        Duration::from_secs(60),
        server.body_written_until_the_client_left(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the client never left"))??;
    assert!(
        written < ANNOUNCED / 10,
        "{written} of {ANNOUNCED} bytes written before the client left"
    );
    Ok(())
}

#[tokio::test]
async fn a_huge_or_garbage_retry_after_is_capped_or_ignored() -> TestResult {
    let cap = WebhookConfig::default().max_retry_after;
    for (value, expected) in [
        ("10000000000000", Some(cap)),
        ("99999999999999999999999999", Some(cap)),
        ("-5", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", Some(Duration::ZERO)),
    ] {
        let answer = response(429, &[("retry-after", value)], b"");
        let server = RawHttpServer::start(Behaviour::Answer(answer)).await?;
        let e = deliver_to(&server.url("/hooks"), Duration::from_secs(5)).await?;
        match e {
            txoutbox::sink::DeliveryError::Retryable { retry_after, .. } => {
                assert_eq!(retry_after, expected, "Retry-After: {value}")
            }
            other => panic!("Retry-After: {value}: {other:?}"),
        }
    }
    Ok(())
}

/// A receiver that read the request and then never answers, or drops the connection: it may
/// have acted, so the outcome is indeterminate (a silent one named as a timeout).
#[tokio::test]
async fn a_receiver_that_reads_the_request_and_then_goes_silent_or_drops_is_indeterminate(
) -> TestResult {
    for (case, behaviour, timeout, says) in [
        (
            "never answers",
            Behaviour::Silent,
            Duration::from_millis(500),
            Some("timed out"),
        ),
        (
            "drops the connection after the request",
            Behaviour::Drop,
            Duration::from_secs(5),
            None,
        ),
    ] {
        let server = RawHttpServer::start(behaviour).await?;
        let e = deliver_to(&server.url("/hooks"), timeout).await?;
        assert_eq!(server.requests_read(), 1, "{case}: the request did arrive");
        assert!(
            matches!(e, txoutbox::sink::DeliveryError::Indeterminate { .. }),
            "{case}: {e:?}"
        );
        if let Some(text) = says {
            assert!(e.to_string().contains(text), "{case}: {e}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_port_with_nothing_listening_is_retryable() -> TestResult {
    let port = closed_port().await?;
    let url = format!("http://127.0.0.1:{port}/hooks");
    let e = deliver_to(&url, Duration::from_secs(5)).await?;
    assert!(
        matches!(e, txoutbox::sink::DeliveryError::Retryable { .. }),
        "{e:?}"
    );
    Ok(())
}
