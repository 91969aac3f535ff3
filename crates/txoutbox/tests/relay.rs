//! The relay against a real Postgres: delivery, retries, dead letters, leases, fencing, ordering,
//! crashes, restarts and shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;
use txoutbox::admin::AttemptOutcome::{Delivered, Failed, Released, Retry, Unknown};
use txoutbox::admin::MessageStatus;
use txoutbox::{
    relay::{DestinationPolicy, RelayConfig, Semantics, WakeMode},
    sink::{Delivery, DeliveryError, Receipt, Sink},
    OutboxMessage,
};
use txoutbox_test_support::factory::db_with_pending;
use txoutbox_test_support::factory::pending_many;
use txoutbox_test_support::hooks::{charge_status, charges_table, MarkCharge};
use txoutbox_test_support::relay::relay_config;
use txoutbox_test_support::relay::{
    quick_retry, CrashableRelay, FailsKey, RecordingSink, RunningRelay, ScriptedSink, SlowSink,
};
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::select::{column, column_pairs, value};
use txoutbox_test_support::{
    assert_outcomes, counts, drain_across_a_restart, eventually, eventually_async,
    kill_after_a_call, leased_by, log_of, receipt_of, status, test_db_with_client,
    test_db_with_sql, wait_for_count, wait_until, Cluster, RelayEvent, RelayEvents, TestDb,
};

type TestResult = anyhow::Result<()>;

#[tokio::test]
async fn committed_rows_are_delivered_and_leave_the_hot_table() -> TestResult {
    let (db, client) = db_with_pending("email", "k", 100).await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("email", sink.clone()).build()?);
    assert_eq!(sink.wait_for(100, Duration::from_secs(20)).await, 100);
    relay.stop().await?;
    let after = counts(&client).await?;
    assert_eq!(after.hot(), 0);
    assert_eq!(after.delivered, 100);
    assert_eq!(receipt_of(&client, "k-7").await?.as_deref(), Some("ok:k-7"));
    Ok(())
}

/// A relay delivering `email` rows to `sink` under `policy`, started.
fn email_relay(
    db: &TestDb,
    sink: impl Sink,
    policy: DestinationPolicy,
) -> anyhow::Result<RunningRelay> {
    Ok(RunningRelay::start(
        db.relay()?
            .sink("email", sink)
            .policy("email", policy)
            .build()?,
    ))
}

/// (outcome, attempt, downstream_key) of a row's attempt log, in order.
async fn attempt_log(client: &Client, key: &str) -> anyhow::Result<Vec<(String, i32, String)>> {
    Ok(client
        .query(
            "SELECT a.outcome, a.attempt, a.downstream_key FROM txoutbox_attempts a \
             WHERE a.downstream_key = $1 ORDER BY a.started_at, a.finished_at",
            &[&key],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// Three relays delivering `destination` rows to `sink`, started.
fn three_relays(
    db: &TestDb,
    destination: &str,
    sink: &(impl Sink + Clone),
) -> anyhow::Result<Vec<RunningRelay>> {
    (0..3)
        .map(|_| {
            Ok(RunningRelay::start(
                db.relay()?.sink(destination, sink.clone()).build()?,
            ))
        })
        .collect()
}

/// Stops every relay of `relays`, one after the other.
async fn stop_all(relays: Vec<RunningRelay>) -> TestResult {
    for relay in relays {
        relay.stop().await?;
    }
    Ok(())
}

/// A transaction of `client` holding the row locks that `locking` (a `SELECT … FOR UPDATE`)
/// takes, until it ends.
async fn holding<'c>(
    client: &'c mut Client,
    locking: &str,
) -> anyhow::Result<tokio_postgres::Transaction<'c>> {
    let tx = client.transaction().await?;
    tx.execute(locking, &[]).await?;
    Ok(tx)
}

#[tokio::test]
async fn ten_thousand_rows_three_relays_each_delivered_exactly_once() -> TestResult {
    let (db, client) = db_with_pending("email", "bulk", 10_000).await?;
    let sink = RecordingSink::new();
    let relays = three_relays(&db, "email", &sink)?;
    assert_eq!(
        sink.wait_for(10_000, Duration::from_secs(120)).await,
        10_000
    );
    stop_all(relays).await?;
    let mut keys: Vec<String> = sink.keys();
    assert_eq!(keys.len(), 10_000, "no row delivered twice");
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 10_000, "every row delivered");
    let after = counts(&client).await?;
    assert_eq!(after.hot(), 0);
    assert_eq!(after.delivered, 10_000);
    Ok(())
}

#[tokio::test]
async fn a_killed_relay_is_redelivered_with_the_same_key_after_its_lease() -> TestResult {
    let (db, client) = db_with_pending("email", "crash", 1).await?;
    // Killed after the sink was called, before the completion committed.
    kill_after_a_call(&db, "email", |relay| relay).await?;
    let second_sink = RecordingSink::new();
    let second = RunningRelay::start(db.relay()?.sink("email", second_sink.clone()).build()?);
    assert_eq!(second_sink.wait_for(1, Duration::from_secs(10)).await, 1);
    second.stop().await?;
    assert_eq!(second_sink.deliveries()[0].downstream_key, "crash-0");
    assert_eq!(second_sink.deliveries()[0].attempt, 2);
    let log = attempt_log(&client, "crash-0").await?;
    assert_eq!(
        log,
        [
            ("expired".to_owned(), 1, "crash-0".to_owned()),
            ("delivered".to_owned(), 2, "crash-0".to_owned())
        ]
    );
    Ok(())
}

#[tokio::test]
async fn a_retryable_failure_is_retried_then_delivered() -> TestResult {
    let (db, client) = db_with_pending("email", "retry", 1).await?;
    let sink = ScriptedSink::new([
        Err(DeliveryError::retryable("connection reset")),
        Err(DeliveryError::retryable("timed out")),
    ]);
    let relay = email_relay(&db, sink.clone(), quick_retry(5))?;
    assert_eq!(
        wait_until(&client, |c| c.delivered >= 1).await?.delivered,
        1
    );
    relay.stop().await?;
    assert_outcomes(&client, "retry-0", [Retry, Retry, Delivered]).await?;
    let errors: Vec<Option<String>> = column(
        &client,
        "SELECT error FROM txoutbox_attempts ORDER BY started_at, finished_at",
    )
    .await?;
    assert_eq!(
        errors,
        [
            Some("connection reset".into()),
            Some("timed out".into()),
            None
        ]
    );
    assert!(sink
        .recorder
        .deliveries()
        .iter()
        .all(|d| d.downstream_key == "retry-0"));
    Ok(())
}

#[tokio::test]
async fn each_attempt_forwards_its_own_span_of_the_enqueued_trace() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let enqueued = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    enqueue_committed(
        &mut client,
        &[OutboxMessage::new("email", &serde_json::json!({ "n": 1 }))?
            .with_downstream_key("traced")
            .with_traceparent(enqueued)?],
    )
    .await?;
    let sink = ScriptedSink::new([Err(DeliveryError::retryable("connection reset"))]);
    // Retry-After is honoured up to the policy's cap: give this policy room for 1.5 s.
    let mut policy = quick_retry(5);
    policy.retry.cap = Duration::from_secs(5);
    let relay = email_relay(&db, sink.clone(), policy)?;
    assert_eq!(sink.recorder.wait_for(2, Duration::from_secs(10)).await, 2);
    relay.stop().await?;
    let forwarded: Vec<txoutbox::telemetry::Traceparent> = sink
        .recorder
        .deliveries()
        .iter()
        .map(|d| txoutbox::telemetry::traceparent(&d.headers))
        .collect::<Option<_>>()
        .ok_or_else(|| anyhow::anyhow!("an attempt carried no valid traceparent"))?;
    let parent_ids: Vec<&str> = forwarded.iter().map(|t| t.parent_id()).collect();
    for t in &forwarded {
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.flags(), "01");
        assert_ne!(
            t.parent_id(),
            "00f067aa0ba902b7",
            "the enqueue-time span was forwarded"
        );
    }
    assert_ne!(
        parent_ids[0], parent_ids[1],
        "two attempts shared a span id"
    );
    // The history keeps the context the row was enqueued with.
    let stored: serde_json::Value = value(
        &client,
        "SELECT headers FROM txoutbox_delivered WHERE downstream_key = 'traced'",
    )
    .await?;
    assert_eq!(stored["traceparent"], enqueued);
    Ok(())
}

#[tokio::test]
async fn retry_after_from_the_sink_is_honoured() -> TestResult {
    let (db, client) = db_with_pending("email", "later", 1).await?;
    let sink = ScriptedSink::new([Err(DeliveryError::retry_after(
        "429 slow down",
        Duration::from_millis(1500),
    ))]);
    // Retry-After is honoured up to the policy's cap: give this policy room for 1.5 s.
    let mut policy = quick_retry(5);
    policy.retry.cap = Duration::from_secs(5);
    let relay = email_relay(&db, sink.clone(), policy)?;
    assert_eq!(sink.recorder.wait_for(2, Duration::from_secs(10)).await, 2);
    relay.stop().await?;
    let calls = sink.recorder.deliveries();
    let next: chrono::DateTime<chrono::Utc> = value(&client, "SELECT min(finished_at) + interval '1.5 seconds' FROM txoutbox_attempts WHERE outcome = 'retry'").await?;
    let second_start: chrono::DateTime<chrono::Utc> = value(
        &client,
        "SELECT started_at FROM txoutbox_attempts WHERE outcome = 'delivered'",
    )
    .await?;
    assert!(
        second_start >= next - chrono::Duration::milliseconds(50),
        "the second attempt waited for the retry-after (started {second_start}, due {next})"
    );
    assert_eq!(calls[1].attempt, 2);
    Ok(())
}

#[tokio::test]
async fn a_permanent_error_dead_letters_at_once() -> TestResult {
    let (db, client) = db_with_pending("email", "perm", 1).await?;
    let sink = ScriptedSink::new([Err(DeliveryError::permanent("550 no such user"))]);
    let mut events = RelayEvents::new();
    let relay = events.start(
        db.relay()?
            .sink("email", sink.clone())
            .policy("email", quick_retry(5)),
    )?;
    assert_eq!(wait_until(&client, |c| c.failed >= 1).await?.failed, 1);
    // A claim begun after the dead letter: a retry it took would be called before the stop ends.
    events.claims(2).await?;
    relay.stop().await?;
    assert_eq!(sink.recorder.count(), 1, "not retried");
    let row = client
        .query_one(
            "SELECT attempts, last_error, lease_owner FROM txoutbox_messages",
            &[],
        )
        .await?;
    assert_eq!(row.get::<_, i32>(0), 1);
    assert_eq!(row.get::<_, String>(1), "550 no such user");
    assert_eq!(row.get::<_, Option<String>>(2), None);
    let log = attempt_log(&client, "perm-0").await?;
    assert_eq!(log, [("failed".to_owned(), 1, "perm-0".to_owned())]);
    Ok(())
}

#[tokio::test]
async fn the_last_attempt_dead_letters() -> TestResult {
    let (db, client) = db_with_pending("email", "max", 1).await?;
    let sink =
        ScriptedSink::new((0..10).map(|i| Err(DeliveryError::retryable(format!("fail {i}")))));
    let relay = email_relay(&db, sink.clone(), quick_retry(3))?;
    assert_eq!(wait_until(&client, |c| c.failed >= 1).await?.failed, 1);
    relay.stop().await?;
    assert_eq!(sink.recorder.count(), 3);
    let last_error: String = value(&client, "SELECT last_error FROM txoutbox_messages").await?;
    assert_eq!(last_error, "gave up after 3 attempts: fail 2");
    assert_outcomes(&client, "max-0", [Retry, Retry, Failed]).await?;
    Ok(())
}

#[tokio::test]
async fn an_unknown_destination_is_a_recorded_permanent_error() -> TestResult {
    let (db, client) = db_with_pending("carrier-pigeon", "coo", 1).await?;
    let relay = RunningRelay::start(db.relay()?.sink("email", RecordingSink::new()).build()?);
    assert_eq!(wait_until(&client, |c| c.failed >= 1).await?.failed, 1);
    relay.stop().await?;
    let last_error: String = value(&client, "SELECT last_error FROM txoutbox_messages").await?;
    assert!(
        last_error.contains("no sink is registered for destination \"carrier-pigeon\""),
        "{last_error}"
    );
    Ok(())
}

/// Panics on the row with key `boom-0`, delivers the rest.
#[derive(Clone, Default)]
struct PanicsOnBoom(RecordingSink);

#[async_trait::async_trait]
impl Sink for PanicsOnBoom {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        if d.downstream_key == "boom-0" && d.attempt == 1 {
            panic!("sink bug");
        }
        self.0.deliver(d).await
    }
}

#[tokio::test]
async fn a_panicking_sink_fails_that_row_only_and_retryably() -> TestResult {
    let (db, client) = db_with_pending("email", "boom", 5).await?;
    let sink = PanicsOnBoom::default();
    let relay = email_relay(&db, sink.clone(), quick_retry(3))?;
    assert_eq!(
        wait_until(&client, |c| c.delivered >= 5).await?.delivered,
        5
    );
    relay.stop().await?;
    let log = attempt_log(&client, "boom-0").await?;
    assert_eq!(log[0].0, "retry");
    let retries: Vec<Option<String>> = log_of(&client, Retry)
        .await?
        .into_iter()
        .map(|entry| entry.error)
        .collect();
    assert_eq!(retries, [Some("the sink panicked: sink bug".to_owned())]);
    Ok(())
}

#[tokio::test]
async fn a_slow_sink_does_not_stall_other_destinations() -> TestResult {
    let (db, mut client) = db_with_pending("slow", "s", 4).await?;
    let slow = SlowSink(RecordingSink::new(), Duration::from_secs(5));
    let fast = RecordingSink::new();
    let relay = RunningRelay::start(
        db.relay()?
            .config(
                RelayConfig::default()
                    .with_concurrency(8)
                    .with_poll_interval(Duration::from_millis(50)),
            )
            .sink("slow", slow.clone())
            .sink("fast", fast.clone())
            .build()?,
    );
    // The slow rows are out: their calls hold four of the eight slots.
    wait_until(&client, |c| c.in_flight >= 4).await?;
    pending_many(&mut client, "fast", "f", 20).await?;
    assert_eq!(fast.wait_for(20, Duration::from_secs(3)).await, 20);
    assert_eq!(slow.0.count(), 0, "the slow deliveries are still running");
    relay.stop().await?;
    Ok(())
}

/// Delivers after a random number of yields, so concurrent deliveries interleave.
#[derive(Clone, Default)]
struct JitterSink(RecordingSink);

#[async_trait::async_trait]
impl Sink for JitterSink {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        // Yield a random number of times: the other deliveries run in between.
        for _ in 0..rand::random_range(0..20) {
            tokio::task::yield_now().await;
        }
        self.0.deliver(d).await
    }
}

#[tokio::test]
async fn rows_of_one_ordering_key_arrive_in_commit_order_under_three_relays() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    // 10 keys, 30 rows each, committed interleaved, one transaction per row.
    for i in 0..30 {
        for k in 0..10 {
            let message = OutboxMessage::new("events", &serde_json::json!({ "key": k, "seq": i }))?
                .with_downstream_key(format!("order-{k}-{i}"))
                .with_ordering_key(format!("account-{k}"));
            enqueue_committed(&mut client, &[message]).await?;
        }
    }
    let sink = JitterSink::default();
    let relays = three_relays(&db, "events", &sink)?;
    assert_eq!(sink.0.wait_for(300, Duration::from_secs(60)).await, 300);
    stop_all(relays).await?;
    for k in 0..10 {
        let seqs: Vec<i64> = sink
            .0
            .deliveries()
            .iter()
            .filter(|d| d.ordering_key.as_deref() == Some(&format!("account-{k}")))
            .map(|d| d.payload["seq"].as_i64().unwrap_or(-1))
            .collect();
        assert_eq!(
            seqs,
            (0..30).collect::<Vec<_>>(),
            "key account-{k} in commit order"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_dead_head_blocks_its_ordering_key_only() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let mut messages = Vec::new();
    for (key, n) in [("a", 0), ("a", 1), ("b", 0), ("b", 1)] {
        messages.push(
            OutboxMessage::new("events", &serde_json::json!({}))?
                .with_downstream_key(format!("{key}-{n}"))
                .with_ordering_key(key),
        );
    }
    enqueue_committed(&mut client, &messages).await?;
    let sink = FailsKey::new("a-0");
    let mut events = RelayEvents::new();
    let relay = events.start(db.relay()?.sink("events", sink.clone()))?;
    assert_eq!(sink.delivered.wait_for(2, Duration::from_secs(10)).await, 2);
    wait_until(&client, |c| c.failed >= 1).await?;
    // A claim begun after the head was dead-lettered: a-1, taken, would be called by the stop.
    events.claims(2).await?;
    relay.stop().await?;
    let keys: Vec<String> = sink.delivered.keys();
    assert_eq!(
        keys,
        ["b-0", "b-1"],
        "key b flows; a-1 waits behind its dead head"
    );
    assert_eq!(status(&client, "a-1").await?, Some(MessageStatus::Pending));
    Ok(())
}

/// Holds the delivery of `held` until `release` is notified; records every delivery.
#[derive(Clone)]
struct Hold {
    held: &'static str,
    release: Arc<tokio::sync::Notify>,
    sink: RecordingSink,
}

#[async_trait::async_trait]
impl Sink for Hold {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        if d.downstream_key == self.held {
            self.release.notified().await;
        }
        self.sink.deliver(d).await
    }
}

/// A claim whose snapshot was taken before the completion of its key's head committed, and
/// which reaches the row behind the head after it: the completion's unpark found that row not
/// yet parked, and the claim, still seeing the head, parks it. The claim ends such a park itself;
/// else the row would wait out the whole park (30 s) with nothing ahead of it.
#[tokio::test]
async fn a_claim_that_raced_the_heads_completion_does_not_hold_the_next_row_back() -> TestResult {
    // A destination with a flow-control state: every claim locks its row before any message
    // row, so a transaction holding it stops a claim just after the claim took its snapshot.
    let (db, mut client) = test_db_with_sql(
        "INSERT INTO txoutbox_destinations (destination, failures) VALUES ('gate', 1)",
    )
    .await?;
    let message = |n: i32| {
        OutboxMessage::new("events", &serde_json::json!({ "n": n })).map(|m| {
            m.with_downstream_key(format!("k-{n}"))
                .with_ordering_key("k")
        })
    };
    enqueue_committed(&mut client, &[message(0)?]).await?;
    let release = Arc::new(tokio::sync::Notify::new());
    let sink = Hold {
        held: "k-0",
        release: release.clone(),
        sink: RecordingSink::new(),
    };
    // One slot: while the head is out the relay does not claim, and it claims again the moment
    // the head's sink returns, before the head is completed.
    let relay = RunningRelay::start(
        db.relay()?
            .config(txoutbox_test_support::relay::relay_config().with_concurrency(1))
            .sink("events", sink.clone())
            .build()?,
    );
    assert_eq!(
        wait_until(&client, |c| c.in_flight >= 1).await?.in_flight,
        1
    );
    enqueue_committed(&mut client, &[message(1)?]).await?;

    let mut gate = db.connect().await?;
    let gate = holding(
        &mut gate,
        "SELECT 1 FROM txoutbox_destinations WHERE destination = 'gate' FOR UPDATE",
    )
    .await?;
    let mut head = db.connect().await?;
    let head = holding(
        &mut head,
        "SELECT 1 FROM txoutbox_messages WHERE downstream_key = 'k-0' FOR UPDATE",
    )
    .await?;
    release.notify_one();
    // The claim waits for the destination's row, the head's completion for the head's row.
    let waiting = "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'";
    assert_eq!(
        wait_for_count(&client, waiting, 2, Duration::from_secs(10)).await?,
        2
    );
    head.commit().await?;
    eventually_async("k-0 is delivered", || async {
        Ok(status(&client, "k-0").await? == Some(MessageStatus::Delivered))
    })
    .await?;
    // Only now does the claim, whose snapshot still holds the head, reach the next row.
    gate.commit().await?;

    assert_eq!(
        sink.sink.wait_for(2, Duration::from_secs(10)).await,
        2,
        "the next row is delivered without waiting out its park"
    );
    relay.stop().await?;
    assert_eq!(sink.sink.keys(), ["k-0", "k-1"]);
    Ok(())
}

#[tokio::test]
async fn a_postgres_restart_while_relaying_loses_no_row() -> TestResult {
    let (cluster, db) = Cluster::private_with_db().await?;
    let mut client = db.connect().await?;
    pending_many(&mut client, "email", "restart", 3_000).await?;
    drop(client);
    let drained = drain_across_a_restart(&cluster, &db, &["email"], 3_000).await?;
    let client = db.connect().await?;
    assert_eq!(
        drained.delivered, 3_000,
        "every row delivered after the restart"
    );
    assert_eq!(counts(&client).await?.hot(), 0);
    assert_eq!(
        drained.distinct_keys, 3_000,
        "at least once: every key reached the sink"
    );
    drop(client);
    drop(db);
    Ok(())
}

/// Blocks its thread, as a process that is paused (SIGSTOP, a VM migration, a swap storm) is:
/// no timer of the relay's can fire for this call meanwhile.
#[derive(Clone)]
struct PausedSink(RecordingSink, Duration);

#[async_trait::async_trait]
impl Sink for PausedSink {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        std::thread::sleep(self.1);
        self.0.deliver(d).await
    }
}

#[tokio::test]
async fn a_relay_paused_past_its_lease_cannot_complete_a_reclaimed_row() -> TestResult {
    let (db, client) = db_with_pending("email", "fence", 1).await?;
    // Relay A is paused mid-call past A's lease; relay B takes the row over and delivers it.
    let sleepy = PausedSink(RecordingSink::new(), Duration::from_millis(2500));
    // A runs on a runtime of its own, as a process of its own would.
    let builder = db.relay()?;
    let paused = sleepy.clone();
    let a = CrashableRelay::start(move || {
        Ok(builder
            .config(
                RelayConfig::default()
                    .with_owner("relay-a")
                    .with_lease(Duration::from_millis(700))
                    .with_reclaim_interval(Duration::from_secs(3600))
                    .with_poll_interval(Duration::from_millis(50)),
            )
            .sink("email", paused)
            .build()?)
    })?;
    eventually_async("relay-a holds the row", || async {
        Ok(leased_by(&client, "relay-a").await? == 1)
    })
    .await?;
    let fast = RecordingSink::new();
    let b = RunningRelay::start(
        db.relay()?
            .config(
                RelayConfig::default()
                    .with_owner("relay-b")
                    .with_poll_interval(Duration::from_millis(50))
                    .with_reclaim_interval(Duration::from_millis(100)),
            )
            .sink("email", fast.clone())
            .build()?,
    );
    assert_eq!(fast.wait_for(1, Duration::from_secs(10)).await, 1);
    assert_eq!(sleepy.0.wait_for(1, Duration::from_secs(10)).await, 1);
    // A's fenced-out completion is logged too: expired, delivered by B, lease lost.
    wait_until(&client, |c| c.attempts >= 3).await?;
    a.stop().await?;
    b.stop().await?;
    let delivered_by: Vec<(i32, String)> =
        column_pairs(&client, "SELECT attempts, receipt FROM txoutbox_delivered").await?;
    assert_eq!(
        delivered_by,
        [(2, "ok:fence-0".to_owned())],
        "one delivered row, B's"
    );
    let log: Vec<(String, String, i32, String)> = client
        .query(
            "SELECT relay, outcome, attempt, downstream_key FROM txoutbox_attempts ORDER BY finished_at",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        log,
        [
            (
                "relay-a".to_owned(),
                "expired".to_owned(),
                1,
                "fence-0".to_owned()
            ),
            (
                "relay-b".to_owned(),
                "delivered".to_owned(),
                2,
                "fence-0".to_owned()
            ),
            (
                "relay-a".to_owned(),
                "lease_lost".to_owned(),
                1,
                "fence-0".to_owned()
            ),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn an_at_most_once_row_whose_relay_died_mid_attempt_is_unknown_not_redelivered() -> TestResult
{
    let (db, client) = db_with_pending("sms", "amo", 1).await?;
    let at_most_once = DestinationPolicy {
        semantics: Semantics::AtMostOnce,
        ..DestinationPolicy::default()
    };
    let policy = at_most_once.clone();
    kill_after_a_call(&db, "sms", move |relay| relay.policy("sms", policy)).await?;
    let second_sink = RecordingSink::new();
    let mut events = RelayEvents::new();
    let second = events.start(
        db.relay()?
            .sink("sms", second_sink.clone())
            .policy("sms", at_most_once),
    )?;
    assert_eq!(wait_until(&client, |c| c.unknown >= 1).await?.unknown, 1);
    // A claim begun after the row became unknown: had it taken it, the stop would let it call.
    events.claims(2).await?;
    second.stop().await?;
    assert_eq!(second_sink.count(), 0, "never redelivered blindly");
    assert_outcomes(&client, "amo-0", [Unknown]).await?;
    Ok(())
}

#[tokio::test]
async fn shutdown_lets_in_flight_deliveries_finish() -> TestResult {
    let (db, client) = db_with_pending("email", "drain", 10).await?;
    let sink = SlowSink(RecordingSink::new(), Duration::from_millis(500));
    let relay = RunningRelay::start(db.relay()?.sink("email", sink.clone()).build()?);
    wait_until(&client, |c| c.in_flight >= 10).await?;
    let report = relay.stop().await?;
    assert_eq!(report.released, 0);
    let after = counts(&client).await?;
    assert_eq!(after.delivered, 10);
    assert_eq!(after.hot(), 0);
    Ok(())
}

#[tokio::test]
async fn shutdown_releases_what_does_not_finish_within_the_grace_period() -> TestResult {
    let (db, client) = db_with_pending("email", "cut", 5).await?;
    let sink = SlowSink(RecordingSink::new(), Duration::from_secs(60));
    let relay = RunningRelay::start(
        db.relay()?
            .config(RelayConfig::default().with_shutdown_grace(Duration::from_millis(300)))
            .sink("email", sink)
            .build()?,
    );
    wait_until(&client, |c| c.in_flight >= 5).await?;
    let report = relay.stop().await?;
    assert_eq!(report.released, 5);
    assert_eq!(counts(&client).await?.pending, 5);
    let leases: Vec<(Option<String>, Option<i64>)> = column_pairs(
        &client,
        "SELECT lease_owner, lease_token FROM txoutbox_messages",
    )
    .await?;
    assert_eq!(leases, vec![(None, None); 5], "none is left leased");
    assert_outcomes(&client, "cut-0", [Released]).await?;
    Ok(())
}

#[tokio::test]
async fn poll_only_mode_delivers_without_listen() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let sink = RecordingSink::new();
    let mut events = RelayEvents::new();
    let relay = events.start_with(
        db.relay()?.sink("email", sink.clone()),
        RelayConfig::default()
            .with_wake(WakeMode::PollOnly)
            .with_poll_interval(Duration::from_millis(100)),
    )?;
    // The first claim found nothing: the rows are found by a poll.
    events.wait_for(|e| *e == RelayEvent::Idle).await?;
    pending_many(&mut client, "email", "poll", 3).await?;
    assert_eq!(sink.wait_for(3, Duration::from_secs(10)).await, 3);
    relay.stop().await?;
    Ok(())
}

#[tokio::test]
async fn the_write_paths_hint_wakes_a_listening_relay_before_its_poll() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let sink = RecordingSink::new();
    let mut events = RelayEvents::new();
    let relay = db
        .relay()?
        .config(events.config(RelayConfig::default().with_poll_interval(Duration::from_secs(300))))
        .sink("email", sink.clone())
        .build()?;
    let probe = relay.clone();
    let running = RunningRelay::start(relay);
    eventually("the relay listens", || probe.listener_connected()).await?;
    // The first (empty) claim has passed: the relay is waiting on its 300 s poll.
    events.wait_for(|e| *e == RelayEvent::Idle).await?;
    pending_many(&mut client, "email", "hint", 1).await?;
    txoutbox::relay::RelayWaker::spawn(db.pool(1)?).wake();
    assert_eq!(
        sink.wait_for(1, Duration::from_secs(10)).await,
        1,
        "delivered long before the 300 s poll"
    );
    running.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_completion_hook_commits_with_the_completion() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    charges_table(&client, &["hook-0"]).await?;
    pending_many(&mut client, "stripe", "hook", 1).await?;
    let hook = MarkCharge::failing();
    let sink = RecordingSink::new();
    let mut events = RelayEvents::new();
    let relay = events.start_with(
        db.relay()?
            .sink("stripe", sink.clone())
            .hook("stripe", hook.clone()),
        RelayConfig::default()
            .with_lease(Duration::from_millis(500))
            .with_poll_interval(Duration::from_millis(50))
            .with_reclaim_interval(Duration::from_millis(100)),
    )?;
    assert_eq!(sink.wait_for(1, Duration::from_secs(10)).await, 1);
    // The first attempt's completion, with its failing hook, is done.
    events
        .wait_for(|e| matches!(e, RelayEvent::Completed { .. }))
        .await?;
    assert_eq!(
        counts(&client).await?.delivered,
        0,
        "a failing hook rolls the completion back"
    );
    hook.fail.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        wait_until(&client, |c| c.delivered >= 1).await?.delivered,
        1
    );
    relay.stop().await?;
    assert_eq!(charge_status(&client, "hook-0").await?, "succeeded");
    assert!(
        sink.count() >= 2,
        "redelivered after the lease, with the same key"
    );
    assert!(sink
        .deliveries()
        .iter()
        .all(|d| d.downstream_key == "hook-0"));
    Ok(())
}

/// A relay stopped while its first heartbeat is still recording it (here: held up by another
/// transaction writing the same owner) deletes its row after that beat, not before: no stale
/// row is left behind by a clean stop.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_stopped_during_its_first_heartbeat_leaves_no_row() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let mut blocker = db.connect().await?;
    let mut events = RelayEvents::new();
    let relay = db
        .relay()?
        .config(events.config(relay_config()))
        .sink("email", RecordingSink::new())
        .build()?;
    let owner = relay.owner().to_owned();
    let hold = blocker.transaction().await?;
    hold.execute(
        "INSERT INTO txoutbox_relays (owner, host, pid, version, heartbeat_every) \
         VALUES ($1, 'elsewhere', 1, '0', interval '5 s')",
        &[&owner],
    )
    .await?;
    let relay = RunningRelay::start(relay);
    // The relay's INSERT of its row waits on the uncommitted one.
    let waiting = wait_for_count(
        &client,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO txoutbox_relays%'",
        1,
        Duration::from_secs(10),
    )
    .await?;
    assert_eq!(waiting, 1, "the relay's first heartbeat waits on the lock");
    let stopping = tokio::spawn(relay.stop());
    events.wait_for(|e| *e == RelayEvent::Stopping).await?;
    hold.rollback().await?;
    stopping.await??;
    assert!(
        txoutbox::admin::relays(&client).await?.is_empty(),
        "the stopped relay's row is gone"
    );
    Ok(())
}
