//! The JetStream consumer (`JetStreamConsumer`) against the real nats-server (`NATS_URL`,
//! default nats://127.0.0.1:4222) and a real Postgres: each message applied once, in a
//! transaction with its inbox record, acked after the commit. Every test uses a stream of its
//! own and deletes it when it ends.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use async_nats::HeaderMap;
use rand::{Rng, SeedableRng};
use txoutbox::inbox::{Consumer, InboxClaim};
use txoutbox::relay::Shutdown;
use txoutbox::OutboxMessage;
use txoutbox_nats::{ConsumerReport, HandlerError, JetStreamConsumer, MessageHandler};
use txoutbox_test_support::select::value;
use txoutbox_test_support::{
    assert_keys_derived_from_the_inbox, count, eventually_some, test_db, wait_for_count, TestDb,
};

type TestResult = anyhow::Result<()>;

const LIMIT: Duration = Duration::from_secs(30);

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A stream and durable consumer of this test's own (the stream deleted when dropped), and a
/// database with a `shipments` table.
struct Fixture {
    db: TestDb,
    js: jetstream::Context,
    stream: String,
    subject: String,
}

impl Fixture {
    async fn new(ack_wait: Duration, duplicate_window: Duration) -> anyhow::Result<Self> {
        Self::on(test_db().await?, None, ack_wait, duplicate_window).await
    }

    /// On `db`, with the stream `existing` when given (else a new one).
    async fn on(
        db: TestDb,
        existing: Option<&str>,
        ack_wait: Duration,
        duplicate_window: Duration,
    ) -> anyhow::Result<Self> {
        let id = existing
            .map(str::to_owned)
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        let js = jetstream::new(async_nats::connect(nats_url()).await?);
        let fixture = Self {
            db,
            js,
            stream: format!("TXOUTBOX_INBOX_{id}"),
            subject: format!("txoutbox.inbox.{id}.charges"),
        };
        if existing.is_none() {
            fixture
                .db
                .connect()
                .await?
                .batch_execute(
                    "CREATE TABLE shipments (id bigserial PRIMARY KEY, message_id text NOT NULL)",
                )
                .await?;
            let stream = fixture
                .js
                .get_or_create_stream(jetstream::stream::Config {
                    name: fixture.stream.clone(),
                    subjects: vec![fixture.subject.clone()],
                    duplicate_window,
                    ..Default::default()
                })
                .await?;
            stream
                .create_consumer(pull::Config {
                    durable_name: Some("shipping".into()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait,
                    ..Default::default()
                })
                .await?;
        }
        Ok(fixture)
    }

    fn id(&self) -> &str {
        self.stream.trim_start_matches("TXOUTBOX_INBOX_")
    }

    /// Publishes one message with `Nats-Msg-Id: id`; true when the stream stored it (false:
    /// JetStream dropped it as a duplicate within its window).
    async fn publish(&self, id: &str) -> anyhow::Result<bool> {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        let ack = self
            .js
            .publish_with_headers(self.subject.clone(), headers, id.to_owned().into())
            .await?
            .await?;
        Ok(!ack.duplicate)
    }

    fn runner<H: MessageHandler>(&self, handler: H) -> anyhow::Result<JetStreamConsumer<H>> {
        Ok(JetStreamConsumer::new(
            self.js.clone(),
            &self.stream,
            "shipping",
            self.db.pool(20)?,
            Consumer::new("shipping")?,
            handler,
        )
        .with_nak_delay(Duration::from_millis(50)))
    }

    /// Waits until the durable consumer has nothing pending and nothing unacked.
    async fn wait_drained(&self) -> TestResult {
        eventually_some("the durable consumer drained", || async {
            let mut consumer: jetstream::consumer::PullConsumer = self
                .js
                .get_consumer_from_stream("shipping", &self.stream)
                .await?;
            let info = consumer.info().await?;
            Ok((info.num_pending == 0 && info.num_ack_pending == 0).then_some(()))
        })
        .await
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        common::delete_stream_now(nats_url(), self.stream.clone());
    }
}

/// The shipping handler: one shipment row and one onward email per message. Fails the first
/// `fail_first` attempts of each message with the given error. With a `gate`, it waits for the
/// gate's permit before it writes; with a `hang` pool, it says on a connection of that pool that
/// it wrote the shipment (a `reached` row), then never returns.
#[derive(Default)]
struct Ship {
    fail_first: u64,
    permanent: bool,
    calls: Mutex<HashMap<String, u64>>,
    gate: Option<Arc<Gate>>,
    hang: Option<deadpool_postgres::Pool>,
}

/// Holds each message until released, saying when one is in its hands.
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
}

impl Ship {
    fn calls(&self) -> u64 {
        self.calls.lock().map(|c| c.values().sum()).unwrap_or(0)
    }
}

#[async_trait::async_trait]
impl MessageHandler for Ship {
    async fn handle(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        _message: &jetstream::Message,
        claim: &mut InboxClaim,
    ) -> Result<(), HandlerError> {
        if let Some(gate) = &self.gate {
            gate.entered.notify_one();
            let _permit = gate
                .release
                .acquire()
                .await
                .map_err(|e| HandlerError::Retryable(e.to_string()))?;
        }
        let id = claim.message_id().to_owned();
        tx.execute("INSERT INTO shipments (message_id) VALUES ($1)", &[&id])
            .await?;
        if let Some(say) = &self.hang {
            let say = say.get().await.map_err(txoutbox::Error::from)?;
            say.execute("INSERT INTO reached (message_id) VALUES ($1)", &[&id])
                .await?;
            std::future::pending::<()>().await;
        }
        let call = {
            let mut calls = self
                .calls
                .lock()
                .map_err(|e| HandlerError::Retryable(e.to_string()))?;
            let n = calls.entry(id.clone()).or_default();
            *n += 1;
            *n
        };
        if call <= self.fail_first {
            let why = format!("attempt {call} of {id} fails");
            return Err(if self.permanent {
                HandlerError::Permanent(why)
            } else {
                HandlerError::Retryable(why)
            });
        }
        claim.enqueue(
            "ships-email",
            OutboxMessage::new("email", &serde_json::json!({"for": id}))?,
        )?;
        Ok(())
    }
}

/// Runs `runner` until the stream is drained and `shipments` reaches `want`, then stops it.
async fn run_until<H: MessageHandler>(
    fixture: &Fixture,
    runner: JetStreamConsumer<H>,
    want: i64,
) -> anyhow::Result<ConsumerReport> {
    let shutdown = Shutdown::new();
    let running = tokio::spawn(runner.run(shutdown.wait()));
    let client = fixture.db.connect().await?;
    wait_for_count(&client, "SELECT count(*) FROM shipments", want, LIMIT).await?;
    fixture.wait_drained().await?;
    shutdown.trigger();
    Ok(running.await??)
}

#[tokio::test]
async fn a_handler_failing_retryably_twice_then_succeeding_makes_one_effect_acked_once(
) -> TestResult {
    let fixture = Fixture::new(Duration::from_secs(30), Duration::from_secs(120)).await?;
    assert!(fixture.publish("charge-1").await?);
    let ship = Arc::new(Ship {
        fail_first: 2,
        ..Default::default()
    });
    let report = run_until(&fixture, fixture.runner(ship.clone())?, 1).await?;
    assert_eq!(ship.calls(), 3);
    assert_eq!(
        report,
        ConsumerReport {
            processed: 1,
            retried: 2,
            ..Default::default()
        }
    );
    let client = fixture.db.connect().await?;
    assert_eq!(
        count(&client, "shipments").await?,
        1,
        "the failed attempts rolled back"
    );
    assert_eq!(count(&client, "txoutbox_messages").await?, 1);
    Ok(())
}

#[tokio::test]
async fn a_permanently_failing_message_is_recorded_and_terminated_not_redelivered() -> TestResult {
    let fixture = Fixture::new(Duration::from_secs(30), Duration::from_secs(120)).await?;
    assert!(fixture.publish("poison").await?);
    let ship = Arc::new(Ship {
        fail_first: u64::MAX,
        permanent: true,
        ..Default::default()
    });
    let shutdown = Shutdown::new();
    let running = tokio::spawn(fixture.runner(ship.clone())?.run(shutdown.wait()));
    let client = fixture.db.connect().await?;
    let failed = eventually_some("a failed inbox record", || async {
        let rows = client
            .query(
                "SELECT message_id FROM txoutbox_inbox WHERE outcome = 'failed'",
                &[],
            )
            .await?;
        Ok((!rows.is_empty()).then_some(rows.len()))
    })
    .await?;
    assert_eq!(failed, 1);
    fixture.wait_drained().await?;
    shutdown.trigger();
    let report = running.await??;
    assert_eq!(report.failed, 1);
    assert_eq!(ship.calls(), 1, "terminated: never redelivered");
    assert_eq!(count(&client, "shipments").await?, 0);
    let found = txoutbox::admin::lookup_inbox(&client, "shipping", "poison", &[])
        .await?
        .ok_or_else(|| anyhow::anyhow!("no record"))?;
    assert!(found
        .record
        .error
        .unwrap_or_default()
        .contains("attempt 1 of poison fails"));
    Ok(())
}

/// 1 000 messages, and 200 of them published again after JetStream's duplicate window (a
/// sender's redelivery that reaches the stream as a new message): 1 000 effects.
#[tokio::test]
async fn a_thousand_messages_with_a_fifth_redelivered_make_a_thousand_effects() -> TestResult {
    let fixture = Fixture::new(Duration::from_secs(30), Duration::from_millis(200)).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1000);
    let ids: Vec<String> = (0..1000).map(|i| format!("charge-{i}")).collect();
    for id in &ids {
        assert!(fixture.publish(id).await?);
    }
    let mut again = 0;
    while again < 200 {
        let id = &ids[rng.random_range(0..ids.len())];
        // Dropped by JetStream while its window lasts: published until the stream stores it.
        if fixture.publish(id).await? {
            again += 1;
        }
    }
    let ship = Arc::new(Ship::default());
    let report = run_until(
        &fixture,
        fixture.runner(ship.clone())?.with_concurrency(16),
        1000,
    )
    .await?;
    assert_eq!((report.processed, report.duplicates), (1000, 200));
    let client = fixture.db.connect().await?;
    assert_eq!(count(&client, "shipments").await?, 1000);
    assert_eq!(
        count(&client, "SELECT count(DISTINCT message_id) FROM shipments").await?,
        1000
    );
    assert_eq!(count(&client, "txoutbox_messages").await?, 1000);
    Ok(())
}

#[tokio::test]
async fn a_message_without_nats_msg_id_is_keyed_by_stream_and_sequence() -> TestResult {
    let fixture = Fixture::new(Duration::from_secs(30), Duration::from_secs(120)).await?;
    fixture
        .js
        .publish(fixture.subject.clone(), "no id".into())
        .await?
        .await?;
    run_until(&fixture, fixture.runner(Arc::new(Ship::default()))?, 1).await?;
    let client = fixture.db.connect().await?;
    let id: String = value(&client, "SELECT message_id FROM txoutbox_inbox").await?;
    assert_eq!(id, format!("{}:1", fixture.stream));
    Ok(())
}

#[tokio::test]
async fn a_stop_lets_the_in_flight_message_finish_and_leaves_the_rest_to_the_server() -> TestResult
{
    let fixture = Fixture::new(Duration::from_secs(30), Duration::from_secs(120)).await?;
    assert!(fixture.publish("charge-1").await?);
    let gate = Arc::new(Gate {
        entered: tokio::sync::Notify::new(),
        release: tokio::sync::Semaphore::new(0),
    });
    let ship = Ship {
        gate: Some(gate.clone()),
        ..Ship::default()
    };
    let shutdown = Shutdown::new();
    let runner = fixture.runner(ship)?.with_concurrency(1);
    let running = tokio::spawn(runner.run(shutdown.wait()));
    gate.entered.notified().await;
    shutdown.trigger();
    // Published after the stop: the stopped consumer does not take it.
    assert!(fixture.publish("charge-2").await?);
    gate.release.add_permits(1);
    let report = running.await??;
    assert_eq!(
        report.processed, 1,
        "the in-flight message finished and was acked"
    );
    let client = fixture.db.connect().await?;
    assert_eq!(count(&client, "shipments").await?, 1);
    let mut consumer: jetstream::consumer::PullConsumer = fixture
        .js
        .get_consumer_from_stream("shipping", &fixture.stream)
        .await?;
    let info = consumer.info().await?;
    assert_eq!(
        info.num_pending + info.num_ack_pending as u64,
        1,
        "charge-2 waits on the server"
    );
    Ok(())
}

/// The consumer of `child_consumer`, run as a process of its own, is SIGKILLed inside its
/// handler; the server redelivers the message after its ack wait to a new consumer: one effect.
#[tokio::test]
async fn a_consumer_killed_mid_handler_is_redelivered_and_makes_one_effect() -> TestResult {
    let fixture = Fixture::new(Duration::from_secs(1), Duration::from_secs(120)).await?;
    assert!(fixture.publish("charge-1").await?);
    let client = fixture.db.connect().await?;
    client
        .batch_execute("CREATE TABLE reached (message_id text)")
        .await?;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["child_consumer", "--exact", "--ignored", "--nocapture"])
        .env("TXOUTBOX_CHILD_DATABASE_URL", fixture.db.url())
        .env("TXOUTBOX_CHILD_STREAM", fixture.id())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    // The child's handler has written its shipment (uncommitted) and says so on its own
    // connection.
    let reached = "SELECT count(*) FROM reached";
    assert_eq!(wait_for_count(&client, reached, 1, LIMIT).await?, 1);
    child.start_kill()?; // SIGKILL
    child.wait().await?;
    assert_eq!(
        count(&client, "shipments").await?,
        0,
        "the kill rolled it back"
    );
    let ship = Arc::new(Ship::default());
    let report = run_until(&fixture, fixture.runner(ship.clone())?, 1).await?;
    assert_eq!(report.processed, 1);
    assert_eq!(count(&client, "shipments").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 1);
    Ok(())
}

/// The process `a_consumer_killed_mid_handler_is_redelivered_and_makes_one_effect` kills: a
/// consumer whose handler writes its shipment, says it got there, and waits forever. Run only
/// by that test (ignored otherwise).
#[tokio::test]
#[ignore = "the child process of a_consumer_killed_mid_handler_is_redelivered_and_makes_one_effect"]
async fn child_consumer() -> TestResult {
    let url = std::env::var("TXOUTBOX_CHILD_DATABASE_URL")?;
    let stream = std::env::var("TXOUTBOX_CHILD_STREAM")?;
    let db = txoutbox_test_support::ConnInfo::parse(&url)?;
    let js = jetstream::new(async_nats::connect(nats_url()).await?);
    let runner = JetStreamConsumer::new(
        js,
        &format!("TXOUTBOX_INBOX_{stream}"),
        "shipping",
        db.pool(2)?,
        Consumer::new("shipping")?,
        Ship {
            hang: Some(db.pool(1)?),
            ..Ship::default()
        },
    );
    runner.run(std::future::pending::<()>()).await?;
    Ok(())
}

/// Many messages, each published by a sender that may retry it; a consumer killed at random
/// between its handler's writes and its commit (its transactions dropped) and restarted:
/// each message's onward effect is enqueued once, with the one key derived for it.
#[tokio::test]
async fn a_consumer_stopped_at_random_enqueues_each_onward_effect_once_with_its_key() -> TestResult
{
    let fixture = Fixture::new(Duration::from_secs(1), Duration::from_millis(200)).await?;
    for i in 0..100 {
        assert!(fixture.publish(&format!("charge-{i}")).await?);
    }
    let client = fixture.db.connect().await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Each round: a consumer that runs a little, then is stopped with no grace (its in-flight
    // transactions dropped, their messages unacked).
    for _ in 0..5 {
        let shutdown = Shutdown::new();
        let runner = fixture
            .runner(Arc::new(Ship::default()))?
            .with_grace(Duration::ZERO);
        let running = tokio::spawn(runner.run(shutdown.wait()));
        let target: i64 = (count(&client, "shipments").await? + rng.random_range(5..20)).min(100);
        wait_for_count(&client, "SELECT count(*) FROM shipments", target, LIMIT).await?;
        shutdown.trigger();
        running.await??;
    }
    run_until(&fixture, fixture.runner(Arc::new(Ship::default()))?, 100).await?;
    assert_eq!(count(&client, "shipments").await?, 100);
    assert_keys_derived_from_the_inbox(&client, "for", "shipping", "ships-email", 100).await?;
    Ok(())
}
