//! The JetStream sink against the real nats-server (`NATS_URL`, default nats://127.0.0.1:4222),
//! a real Postgres and the real relay. Every test uses a stream and subject of its own and
//! deletes the stream when it ends.

mod common;

use std::time::Duration;

use async_nats::jetstream;
use tokio_postgres::Client;
use txoutbox::admin::AttemptOutcome;
use txoutbox::{
    relay::{DestinationPolicy, RetryPolicy},
    sink::{Delivery, Sink},
};
use txoutbox_nats::{NatsMessage, NatsSink, PublishReceipt, NATS_MSG_ID};
use txoutbox_test_support::abort_after_a_call;
use txoutbox_test_support::process::wait_for_listener;
use txoutbox_test_support::relay::{
    assert_lease_must_hold_the_timeout, fail_raw_payload, short_lease, RunningRelay,
};
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::{
    delivered_attempts, eventually_some, free_port, log_of, logged, receipt_of, test_db,
    test_db_with_client, wait_until,
};

type TestResult = anyhow::Result<()>;

const DESTINATION: &str = "nats:orders";

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A stream of this test's own, deleted when dropped (also when the test fails).
struct TestStream {
    name: String,
    subject: String,
    url: String,
}

impl TestStream {
    async fn create(sink: &NatsSink, url: &str) -> anyhow::Result<Self> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let stream = Self {
            name: format!("TXOUTBOX_TEST_{id}"),
            subject: format!("txoutbox.test.{id}.orders"),
            url: url.to_owned(),
        };
        sink.ensure_stream(&stream.name, &[&stream.subject], Duration::from_secs(120))
            .await?;
        Ok(stream)
    }

    async fn info(&self, sink: &NatsSink) -> anyhow::Result<jetstream::stream::Info> {
        let mut stream = sink.jetstream().get_stream(&self.name).await?;
        Ok(stream.info().await?.clone())
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        common::delete_stream_now(self.url.clone(), self.name.clone());
    }
}

async fn enqueue(client: &mut Client, message: NatsMessage, key: &str) -> TestResult {
    let row = message
        .into_outbox_message_for(DESTINATION)?
        .with_downstream_key(key)
        .with_header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
    enqueue_committed(client, &[row]).await?;
    Ok(())
}

async fn receipt(client: &Client, key: &str) -> anyhow::Result<PublishReceipt> {
    let text = receipt_of(client, key)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{key} was delivered without a receipt"))?;
    Ok(PublishReceipt::parse(&text)?)
}

#[tokio::test]
async fn normal_delivery_publishes_with_the_key_as_msg_id_and_stores_the_ack() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let sink = NatsSink::connect(&nats_url()).await?;
    let stream = TestStream::create(&sink, &nats_url()).await?;
    let data = serde_json::json!({ "order": 42 });
    enqueue(
        &mut client,
        NatsMessage::new(data.clone()).to_subject(&stream.subject),
        "evt-1",
    )
    .await?;

    let relay = RunningRelay::start(db.relay()?.sink(DESTINATION, sink.clone()).build()?);
    assert_eq!(
        wait_until(&client, |c| c.delivered >= 1).await?.delivered,
        1
    );
    relay.stop().await?;

    let ack = receipt(&client, "evt-1").await?;
    assert_eq!(
        ack,
        PublishReceipt {
            stream: stream.name.clone(),
            seq: 1,
            duplicate: false
        }
    );
    let js_stream = sink.jetstream().get_stream(&stream.name).await?;
    let stored = js_stream.get_raw_message(ack.seq).await?;
    assert_eq!(stored.subject.as_str(), stream.subject);
    assert_eq!(
        stored.headers.get(NATS_MSG_ID).map(|v| v.as_str()),
        Some("evt-1")
    );
    assert!(stored.headers.get("traceparent").is_some());
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&stored.payload)?,
        data
    );
    Ok(())
}

#[tokio::test]
async fn a_redelivery_after_a_crash_past_the_ack_is_dropped_as_a_duplicate() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let sink = NatsSink::connect(&nats_url()).await?;
    let stream = TestStream::create(&sink, &nats_url()).await?;
    let sink = sink.with_subject(&stream.subject); // the destination's subject
    enqueue(
        &mut client,
        NatsMessage::new(serde_json::json!({ "n": 1 })),
        "evt-2",
    )
    .await?;

    abort_after_a_call(&db, DESTINATION, sink.clone(), |relay| relay).await?;
    assert_eq!(stream.info(&sink).await?.state.messages, 1);

    let second = RunningRelay::start(
        db.relay()?
            .config(short_lease())
            // Publishes that fit in the 1 s lease (the relay refuses the default 5 s).
            .sink(
                DESTINATION,
                sink.clone().with_ack_timeout(Duration::from_millis(500)),
            )
            .build()?,
    );
    wait_until(&client, |c| c.delivered >= 1).await?;
    assert_eq!(delivered_attempts(&client).await?, [2]);
    second.stop().await?;

    assert_eq!(
        stream.info(&sink).await?.state.messages,
        1,
        "JetStream dropped the redelivery"
    );
    let ack = receipt(&client, "evt-2").await?;
    assert!(ack.duplicate, "the second ack says duplicate: {ack:?}");
    assert_eq!(ack.seq, 1, "and points at the message first stored");
    Ok(())
}

#[tokio::test]
async fn a_subject_no_stream_captures_is_dead_lettered() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let sink = NatsSink::connect(&nats_url()).await?;
    let subject = format!("txoutbox.nostream.{}", uuid::Uuid::new_v4().simple());
    enqueue(
        &mut client,
        NatsMessage::new(serde_json::json!({})).to_subject(&subject),
        "evt-3",
    )
    .await?;

    let relay = RunningRelay::start(db.relay()?.sink(DESTINATION, sink).build()?);
    assert_eq!(wait_until(&client, |c| c.failed >= 1).await?.failed, 1);
    relay.stop().await?;

    let row = client
        .query_one("SELECT attempts, last_error FROM txoutbox_messages", &[])
        .await?;
    let (attempts, error): (i32, String) = (row.get(0), row.get(1));
    assert_eq!(attempts, 1, "dead-lettered at once, not retried");
    assert!(
        error.contains("no JetStream stream captures subject"),
        "{error}"
    );
    Ok(())
}

#[tokio::test]
async fn a_raw_payload_of_the_wrong_shape_is_dead_lettered_naming_the_builder() -> TestResult {
    let db = test_db().await?;
    let sink = NatsSink::connect(&nats_url()).await?;
    // `body` where the payload's field is `data`.
    let raw = serde_json::json!({ "subject": "orders.paid", "body": { "order": 42 } });
    let error = fail_raw_payload(&db, DESTINATION, &raw, txoutbox_nats::check, sink).await?;
    assert!(
        error.starts_with("malformed payload (build it with txoutbox_nats::NatsMessage): ")
            && error.contains("data"),
        "{error}"
    );
    Ok(())
}

/// A nats-server of the test's own, on a free port, that the test can kill and restart.
struct PrivateServer {
    port: u16,
    store: std::path::PathBuf,
    child: Option<tokio::process::Child>,
}

impl PrivateServer {
    fn new() -> anyhow::Result<Self> {
        let port = free_port()?;
        let store =
            std::env::temp_dir().join(format!("txoutbox-nats-{}", uuid::Uuid::new_v4().simple()));
        Ok(Self {
            port,
            store,
            child: None,
        })
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn start(&mut self) -> TestResult {
        let binary = [
            "nats-server",
            "/usr/sbin/nats-server",
            "/usr/bin/nats-server",
        ]
        .into_iter()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok()
        })
        .ok_or_else(|| anyhow::anyhow!("nats-server not found (apt-get install nats-server)"))?;
        let child = tokio::process::Command::new(binary)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        wait_for_listener(([127, 0, 0, 1], self.port).into()).await
    }

    /// Sends the server `signal` (`STOP`: it keeps its connections and answers nothing; `CONT`).
    fn signal(&self, signal: &str) -> TestResult {
        let pid = self
            .child
            .as_ref()
            .and_then(|c| c.id())
            .ok_or_else(|| anyhow::anyhow!("the server is not running"))?;
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
        if signal == "STOP" {
            wait_stopped(pid)?;
        }
        Ok(())
    }

    async fn kill(&mut self) -> TestResult {
        if let Some(mut child) = self.child.take() {
            child.kill().await?;
        }
        Ok(())
    }
}

/// Waits until every thread of process `pid` has stopped: `kill` returns once the signal is
/// sent, and a thread still running may yet answer what arrives before it stops.
fn wait_stopped(pid: u32) -> TestResult {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut running = false;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let stat = std::fs::read_to_string(task?.path().join("stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            running |= !matches!(state, Some('T' | 't') | None);
        }
        if !running {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "process {pid} did not stop within 5 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

#[tokio::test]
async fn a_publish_while_the_server_is_down_is_retried_and_delivered_once_it_is_back() -> TestResult
{
    let (db, mut client) = test_db_with_client().await?;
    let mut server = PrivateServer::new()?;
    server.start().await?;
    let nats = async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(server.url())
        .await?;
    let sink = NatsSink::new(nats).with_ack_timeout(Duration::from_millis(500));
    let stream = TestStream::create(&sink, &server.url()).await?;
    let sink = sink.with_subject(&stream.subject);
    server.kill().await?;

    enqueue(
        &mut client,
        NatsMessage::new(serde_json::json!({ "n": 4 })),
        "evt-4",
    )
    .await?;
    let fast = DestinationPolicy {
        retry: RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            max_attempts: 100,
        },
        ..DestinationPolicy::default()
    };
    let relay = RunningRelay::start(
        db.relay()?
            .sink(DESTINATION, sink.clone())
            .policy(DESTINATION, fast)
            .build()?,
    );
    eventually_some("retried while down", || async {
        Ok((logged(&client, AttemptOutcome::Retry).await? >= 2).then_some(()))
    })
    .await?;
    server.start().await?;
    assert_eq!(
        wait_until(&client, |c| c.delivered >= 1).await?.delivered,
        1
    );
    relay.stop().await?;

    let retries = log_of(&client, AttemptOutcome::Retry).await?;
    let error = retries[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("JetStream publish"), "{error}");
    assert_eq!(
        stream.info(&sink).await?.state.messages,
        1,
        "one message, however many attempts reached the server"
    );
    drop(stream); // while the server still runs
    Ok(())
}

#[tokio::test]
async fn a_relay_whose_lease_cannot_hold_the_ack_timeout_is_refused() -> TestResult {
    let sink = NatsSink::connect(&nats_url()).await?;
    assert_eq!(sink.timeout(), Some(txoutbox_nats::DEFAULT_ACK_TIMEOUT));
    let slow = sink.clone().with_ack_timeout(Duration::from_secs(20));
    assert_eq!(slow.timeout(), Some(Duration::from_secs(20)));
    // The default 5 s fits in a 10 s lease.
    assert_lease_must_hold_the_timeout(DESTINATION, "ack timeout", slow, sink)?;
    Ok(())
}

#[tokio::test]
async fn a_server_that_stops_answering_is_cut_off_at_the_ack_timeout() -> TestResult {
    let mut server = PrivateServer::new()?;
    server.start().await?;
    let timeout = Duration::from_millis(500);
    let sink = NatsSink::new(async_nats::connect(server.url()).await?).with_ack_timeout(timeout);
    let stream = TestStream::create(&sink, &server.url()).await?;
    let delivery = Delivery {
        id: uuid::Uuid::now_v7(),
        destination: DESTINATION.to_owned(),
        payload: serde_json::to_value(
            NatsMessage::new(serde_json::json!({ "n": 5 })).to_subject(&stream.subject),
        )?,
        headers: Default::default(),
        downstream_key: "evt-5".to_owned(),
        ordering_key: None,
        attempt: 1,
        created_at: chrono::Utc::now(),
    };
    server.signal("STOP")?; // the connection stays open; nothing is answered
                            // A hang guard, not a bound on speed: only the ack timeout can end the call.
    let outcome = tokio::time::timeout(Duration::from_secs(60), sink.deliver(&delivery)).await;
    server.signal("CONT")?;
    let err = outcome
        .map_err(|_| anyhow::anyhow!("the ack timeout never ended the call"))?
        .expect_err("no ack from a stopped server");
    assert!(!err.is_permanent(), "{err:?}");
    // The sink's bound of the call, or the JetStream context's ack timeout it set to the same
    // value: both fire together, and either one says the ack did not come in time.
    let text = err.to_string();
    assert!(
        text.contains(&format!("no ack within {timeout:?}"))
            || text.contains("didn't receive ack in time"),
        "{err}"
    );
    drop(stream); // while the server still runs
    Ok(())
}
