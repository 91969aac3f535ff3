//! The relay under hostile inputs and badly timed faults: poisoned outcomes, a Retry-After of
//! ten trillion seconds, a completion the database refuses, a shutdown while completions cannot be
//! written, while a claim is running or while rows wait in the local queue, a sink slower than
//! its lease, rows behind a dead ordering
//! head, at-most-once by default policy, failing and slow completion hooks, a role whose
//! statement_timeout is shorter than a claim.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txoutbox::admin::AttemptOutcome::{Delivered, Failed as DeadLettered, Retry};
use txoutbox::{
    enqueue,
    relay::{DestinationPolicy, RelayConfig, RetryPolicy, Semantics},
    sink::{Delivery, DeliveryError, Receipt, Sink},
    OutboxMessage,
};
use txoutbox_test_support::factory::db_with_pending;
use txoutbox_test_support::factory::{pending, pending_many};
use txoutbox_test_support::hooks::{charge_status, charges_table, MarkCharge};
use txoutbox_test_support::relay::{quick_retry, RecordingSink, RunningRelay};
use txoutbox_test_support::select::{column_pairs, value, value_with};
use txoutbox_test_support::{
    assert_outcomes, count, counts, counts_for, due, eventually, eventually_async,
    kill_after_a_call, other_sessions_ended, test_db_with_client, test_db_with_sql, wait_for_count,
    wait_until, Counts, RelayEvent, RelayEvents, TestDb,
};

type TestResult = anyhow::Result<()>;

/// Answers every call with the same error (and records the calls).
#[derive(Clone)]
struct Failing(RecordingSink, DeliveryError);

#[async_trait::async_trait]
impl Sink for Failing {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        let _ = self.0.deliver(d).await;
        Err(self.1.clone())
    }
}

/// How many calls each downstream key got.
fn calls_per_key(sink: &RecordingSink) -> HashMap<String, usize> {
    let mut calls = HashMap::new();
    for d in sink.deliveries() {
        *calls.entry(d.downstream_key).or_default() += 1;
    }
    calls
}

/// What a drain read of the hot table, from the statistics views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HotTableReads {
    /// Rows read by sequential scans.
    seq_rows: i64,
    /// Entries read from the claim's index (`txoutbox_messages_due`).
    due_entries: i64,
    /// Descents into the primary key (one per key looked up).
    pkey_scans: i64,
}

impl HotTableReads {
    async fn now(client: &tokio_postgres::Client) -> anyhow::Result<Self> {
        client
            .batch_execute("SELECT pg_stat_clear_snapshot()")
            .await?;
        let row = client
            .query_one(
                "SELECT t.seq_tup_read, d.idx_tup_read, p.idx_scan \
                 FROM pg_stat_user_tables t, pg_stat_user_indexes d, pg_stat_user_indexes p \
                 WHERE t.relname = 'txoutbox_messages' \
                     AND d.indexrelname = 'txoutbox_messages_due' \
                     AND p.indexrelname = 'txoutbox_messages_pkey'",
                &[],
            )
            .await?;
        Ok(Self {
            seq_rows: row.get(0),
            due_entries: row.get(1),
            pkey_scans: row.get(2),
        })
    }

    fn since(self, before: Self) -> Self {
        Self {
            seq_rows: self.seq_rows - before.seq_rows,
            due_entries: self.due_entries - before.due_entries,
            pkey_scans: self.pkey_scans - before.pkey_scans,
        }
    }
}

/// A test database arranged by `setup` (SQL), drained by [`drain_email_reading_the_hot_table`]:
/// the database, a client, the sink and what the relay read.
async fn drain_after(
    setup: &str,
    deliveries: usize,
) -> anyhow::Result<(TestDb, tokio_postgres::Client, RecordingSink, HotTableReads)> {
    let (db, client) = test_db_with_sql(setup).await?;
    let (sink, read) = drain_email_reading_the_hot_table(&db, &client, deliveries).await?;
    Ok((db, client, sink, read))
}

/// Runs a relay claiming 100 rows at a time until its `email` sink has `deliveries` calls, then
/// stops it; returns the sink and what the relay read of the hot table meanwhile.
async fn drain_email_reading_the_hot_table(
    db: &TestDb,
    client: &tokio_postgres::Client,
    deliveries: usize,
) -> anyhow::Result<(RecordingSink, HotTableReads)> {
    let before = HotTableReads::now(client).await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(
        db.relay()?
            .config(
                RelayConfig::default()
                    .with_batch_size(100)
                    .with_sample_interval(Duration::ZERO)
                    .with_reclaim_interval(Duration::from_secs(60)),
            )
            .sink("email", sink.clone())
            .build()?,
    );
    assert_eq!(
        sink.wait_for(deliveries, Duration::from_secs(120)).await,
        deliveries
    );
    relay.stop().await?;
    // The relay's backends report their statistics as they exit.
    other_sessions_ended(client).await?;
    Ok((sink, HotTableReads::now(client).await?.since(before)))
}

/// What a relay left of one `webhook` row, `poison`, among rows of `email` that deliver.
struct Poisoned {
    /// The counts once the poison was dead-lettered and every good row delivered.
    reached: Counts,
    /// The sink of the good rows.
    good: RecordingSink,
}

/// Writes `poison`, whose every call fails with `error` (dead-lettered after `attempts`), and
/// `good` rows of `email` (keys `good-{i}`), and runs a relay until both happened.
async fn poison_among_good(
    db: &TestDb,
    client: &mut tokio_postgres::Client,
    error: DeliveryError,
    attempts: u32,
    good: usize,
) -> anyhow::Result<Poisoned> {
    pending(&mut *client, "webhook", "poison").await?;
    pending_many(&mut *client, "email", "good", good).await?;
    let poison = Failing(RecordingSink::new(), error);
    let good_sink = RecordingSink::new();
    let relay = RunningRelay::start(
        db.relay()?
            .sink("webhook", poison)
            .sink("email", good_sink.clone())
            .policy("webhook", quick_retry(attempts))
            .build()?,
    );
    let delivered = good as i64;
    let reached = wait_until(client, |c| c.failed >= 1 && c.delivered >= delivered).await?;
    relay.stop().await?;
    Ok(Poisoned {
        reached,
        good: good_sink,
    })
}

/// The `last_error` of the row `poison`.
async fn last_error_of_the_poison(client: &tokio_postgres::Client) -> anyhow::Result<String> {
    value(
        client,
        "SELECT last_error FROM txoutbox_messages WHERE downstream_key = 'poison'",
    )
    .await
}

#[tokio::test]
async fn a_downstream_error_full_of_nul_bytes_fails_its_row_alone() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let error = DeliveryError::retryable("HTTP 500: \0\0\u{1}binary\0body");
    let Poisoned { reached, good } = poison_among_good(&db, &mut client, error, 3, 10).await?;
    assert_eq!(
        reached.failed, 1,
        "the poisoned row is dead-lettered on its own"
    );
    assert_eq!(reached.delivered, 10, "every other row is delivered");
    assert!(
        calls_per_key(&good).values().all(|&n| n == 1),
        "each good row was handed to its sink once: {:?}",
        calls_per_key(&good)
    );
    let error = last_error_of_the_poison(&client).await?;
    assert!(error.contains("binary"), "{error}");
    assert!(!error.contains('\0'));
    // Every attempt is in the log.
    assert_outcomes(&client, "poison", [Retry, Retry, DeadLettered]).await?;
    Ok(())
}

#[tokio::test]
async fn a_retry_after_of_ten_trillion_seconds_waits_the_policys_cap() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending(&mut client, "stripe", "later").await?;
    let sink = txoutbox_test_support::relay::ScriptedSink::new([Err(DeliveryError::retry_after(
        "429 Too Many Requests",
        Duration::from_secs(10_000_000_000_000),
    ))]);
    let mut policy = quick_retry(3);
    policy.retry.cap = Duration::from_millis(500);
    let relay = RunningRelay::start(
        db.relay()?
            .sink("stripe", sink.clone())
            .policy("stripe", policy)
            .build()?,
    );
    let delivered = wait_until(&client, |c| c.delivered >= 1).await?.delivered;
    relay.stop().await?;
    assert_eq!(delivered, 1, "retried at the cap, then delivered");
    assert_eq!(sink.recorder.count(), 2);
    assert_outcomes(&client, "later", [Retry, Delivered]).await?;
    Ok(())
}

#[tokio::test]
async fn a_completion_the_database_refuses_does_not_hold_its_batch() -> TestResult {
    // A row whose outcome text the database refuses (as it refused NUL bytes), by a trigger.
    let (db, mut client) = test_db_with_sql(
        "CREATE FUNCTION refuse_marker() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.last_error LIKE '%refuse-me%' THEN \
                 RAISE EXCEPTION 'refused' USING ERRCODE = '22023'; END IF; \
               RETURN NEW; END $$; \
             CREATE TRIGGER refuse BEFORE UPDATE ON txoutbox_messages \
               FOR EACH ROW EXECUTE FUNCTION refuse_marker();",
    )
    .await?;
    let error = DeliveryError::retryable("refuse-me");
    let Poisoned { reached, good } = poison_among_good(&db, &mut client, error, 2, 20).await?;
    assert_eq!(reached.delivered, 20);
    assert!(calls_per_key(&good).values().all(|&n| n == 1));
    assert_eq!(
        reached.failed, 1,
        "the refused row is retried and dead-lettered on its own"
    );
    assert_eq!(
        last_error_of_the_poison(&client).await?,
        "the failed outcome's text could not be stored (SQLSTATE 22023)"
    );
    Ok(())
}

#[tokio::test]
async fn shutdown_returns_in_time_when_no_completion_can_be_written() -> TestResult {
    let (db, client) = db_with_pending("email", "wedged", 100).await?;
    // Every delivered completion waits for this lock: the completer is wedged.
    let mut locker = db.connect().await?;
    let lock = locker.transaction().await?;
    lock.batch_execute("LOCK TABLE txoutbox_delivered IN ACCESS EXCLUSIVE MODE")
        .await?;
    let sink = RecordingSink::new();
    let grace = Duration::from_millis(500);
    let relay = RunningRelay::start(
        db.relay()?
            .config(
                RelayConfig::default()
                    .with_concurrency(4)
                    .with_lease(Duration::from_secs(2))
                    .with_shutdown_grace(grace)
                    .with_poll_interval(Duration::from_millis(50)),
            )
            .sink("email", sink.clone())
            .build()?,
    );
    // Enough outcomes to fill the completer's queue behind the wedged writers.
    assert!(sink.wait_for(20, Duration::from_secs(10)).await >= 12);
    let asked = Instant::now();
    let stopped = tokio::time::timeout(
        grace + txoutbox::relay::SHUTDOWN_FLUSH + Duration::from_secs(3),
        relay.stop(),
    )
    .await;
    let took = asked.elapsed();
    lock.rollback().await?;
    assert!(
        stopped.is_ok(),
        "the relay did not return within grace + flush (waited {took:?})"
    );
    stopped??;
    // Nothing is lost: another relay delivers every row once the leases are back.
    let second = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("email", second.clone()).build()?);
    let delivered = wait_until(&client, |c| c.delivered >= 100).await?.delivered;
    relay.stop().await?;
    assert_eq!(delivered, 100);
    Ok(())
}

#[tokio::test]
async fn a_shutdown_during_a_claim_leaves_no_row_leased() -> TestResult {
    // Each row the claim leases takes 20 ms: a claim of 50 rows runs for a second.
    let (db, mut client) = test_db_with_sql(
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.status = 'in_flight' AND OLD.status = 'pending' THEN \
                 PERFORM pg_sleep(0.02); END IF; \
               RETURN NEW; END $$; \
             CREATE TRIGGER slow BEFORE UPDATE ON txoutbox_messages \
               FOR EACH ROW EXECUTE FUNCTION slow_claim();",
    )
    .await?;
    pending_many(&mut client, "sms", "mid-claim", 50).await?;
    let sink = RecordingSink::new();
    let at_most_once = DestinationPolicy {
        semantics: Semantics::AtMostOnce,
        ..DestinationPolicy::default()
    };
    let relay = RunningRelay::start(
        db.relay()?
            .config(
                RelayConfig::default()
                    .with_batch_size(50)
                    .with_lease(Duration::from_secs(2)),
            )
            .sink("sms", sink.clone())
            .policy("sms", at_most_once.clone())
            .build()?,
    );
    wait_for_count(
        &client,
        // The claim is in its trigger's sleep (whatever the statement's text).
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
         AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()",
        1,
        Duration::from_secs(5),
    )
    .await?;
    relay.stop().await?;
    // Whatever the claim committed on the server has landed once its session has ended: no
    // statement of the stopped relay can lease a row after this.
    other_sessions_ended(&client).await?;
    assert_eq!(
        counts(&client).await?.in_flight,
        0,
        "no row is left leased by the relay that stopped"
    );
    assert_eq!(sink.count(), 0, "the sink was never called");
    // A second relay finds no at-most-once row to give up on: none was ever sent, and no lease
    // of the first is left to expire.
    let relay = RunningRelay::start(
        db.relay()?
            .sink("sms", sink.clone())
            .policy("sms", at_most_once)
            .build()?,
    );
    let reached = wait_until(&client, |c| c.delivered >= 50).await?;
    relay.stop().await?;
    assert_eq!(reached.delivered, 50);
    assert_eq!(
        reached.attempts, 50,
        "one attempt a row, each delivered: unknown only where a call was started"
    );
    assert_eq!(sink.count(), 50);
    Ok(())
}

/// Never answers the first call of each row, answers at once after; records how many calls of one
/// row ran at the same time, and when each call began and ended (a call cut off by the relay ends
/// when its future is dropped).
#[derive(Clone, Default)]
struct SlowFirstCall {
    running: Arc<Mutex<HashMap<String, usize>>>,
    most_at_once: Arc<AtomicUsize>,
    calls: Arc<Mutex<Vec<Call>>>,
}

/// One call: the row's key, when it began, when it ended.
type Call = (String, Instant, Option<Instant>);

struct CallGuard(SlowFirstCall, String, usize);

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Ok(mut running) = self.0.running.lock() {
            *running.entry(self.1.clone()).or_default() -= 1;
        }
        if let Ok(mut calls) = self.0.calls.lock() {
            calls[self.2].2 = Some(Instant::now());
        }
    }
}

impl SlowFirstCall {
    /// True when every call made so far has ended.
    fn all_ended(&self) -> bool {
        self.calls
            .lock()
            .map(|c| c.iter().all(|(_, _, end)| end.is_some()))
            .unwrap_or(false)
    }
}

#[async_trait::async_trait]
impl Sink for SlowFirstCall {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        let key = d.downstream_key.clone();
        let now = self
            .running
            .lock()
            .map(|mut r| {
                let n = r.entry(key.clone()).or_default();
                *n += 1;
                *n
            })
            .unwrap_or(0);
        self.most_at_once.fetch_max(now, Ordering::Relaxed);
        let index = self
            .calls
            .lock()
            .map(|mut c| {
                c.push((key.clone(), Instant::now(), None));
                c.len() - 1
            })
            .unwrap_or(0);
        let _guard = CallGuard(self.clone(), key, index);
        if d.attempt == 1 {
            // Never answers: only the relay's limit on one call ends it.
            std::future::pending::<()>().await;
        }
        Ok(Receipt::new("ok"))
    }
}

/// A relay with a lease of 1 s (a call is cut off after 800 ms) that takes back expired leases
/// every 50 ms, delivering `webhook` rows to `sink` with quick retries.
fn cutting_off(db: &TestDb, sink: &SlowFirstCall) -> anyhow::Result<RunningRelay> {
    Ok(RunningRelay::start(
        db.relay()?
            .config(
                RelayConfig::default()
                    .with_lease(Duration::from_secs(1))
                    .with_poll_interval(Duration::from_millis(20))
                    .with_reclaim_interval(Duration::from_millis(50)),
            )
            .sink("webhook", sink.clone())
            .policy("webhook", quick_retry(5))
            .build()?,
    ))
}

#[tokio::test]
async fn a_relay_never_runs_two_attempts_of_one_row() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending(&mut client, "webhook", "slow").await?;
    let sink = SlowFirstCall::default();
    let relay = cutting_off(&db, &sink)?;
    let delivered = wait_until(&client, |c| c.delivered >= 1).await?.delivered;
    // Every call has ended (a first call not cut off would never end).
    eventually("every call of the row has ended", || sink.all_ended()).await?;
    relay.stop().await?;
    assert_eq!(delivered, 1);
    assert_eq!(
        sink.most_at_once.load(Ordering::Relaxed),
        1,
        "never two calls of one row at once"
    );
    let log: Vec<(String, Option<String>)> = column_pairs(
        &client,
        "SELECT outcome, error FROM txoutbox_attempts ORDER BY attempt, finished_at",
    )
    .await?;
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0].0, "retry");
    assert!(
        log[0]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("did not answer within")),
        "{log:?}"
    );
    assert_eq!(log[1].0, "delivered");
    Ok(())
}

#[tokio::test]
async fn a_cut_off_head_ends_before_the_next_row_of_its_key_starts() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let tx = client.transaction().await?;
    let messages = (0..2)
        .map(|i| {
            OutboxMessage::new("webhook", &serde_json::json!({ "i": i })).map(|m| {
                m.with_downstream_key(format!("ordered-{i}"))
                    .with_ordering_key("account-7")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    enqueue(&tx, &messages).await?;
    tx.commit().await?;
    let sink = SlowFirstCall::default();
    let relay = cutting_off(&db, &sink)?;
    let delivered = wait_until(&client, |c| c.delivered >= 2).await?.delivered;
    // A head call still running (not cut off) counts as ending now, after the next row began.
    relay.stop().await?;
    assert_eq!(delivered, 2);
    let calls = sink.calls.lock().map(|c| c.clone()).unwrap_or_default();
    let head_ends: Vec<Instant> = calls
        .iter()
        .filter(|(k, _, _)| k == "ordered-0")
        .map(|(_, _, end)| end.unwrap_or_else(Instant::now))
        .collect();
    let next_start = calls
        .iter()
        .find(|(k, _, _)| k == "ordered-1")
        .map(|(_, start, _)| *start);
    let next_start = next_start.ok_or_else(|| anyhow::anyhow!("ordered-1 was never called"))?;
    assert!(
        head_ends.iter().all(|end| *end <= next_start),
        "every call of the head ended before the next row of its key began"
    );
    Ok(())
}

#[tokio::test]
async fn claims_do_not_rescan_rows_waiting_behind_a_dead_head() -> TestResult {
    // A dead-lettered head with 20 000 rows behind it, all due before the other traffic.
    let (db, mut client) = test_db_with_sql(
        "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key, status, next_attempt_at) \
             VALUES (gen_random_uuid(), 'events', '{}', 'head', 'stuck', 'failed', \
                 now() - interval '2 hours'); \
             INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key, next_attempt_at) \
             SELECT gen_random_uuid(), 'events', '{}', 'behind-' || i, 'stuck', \
                 now() - interval '1 hour' FROM generate_series(1, 20000) AS i; \
             ANALYZE txoutbox_messages;",
    )
    .await?;
    pending_many(&mut client, "email", "other", 2000).await?;
    let read = "SELECT idx_tup_read FROM pg_stat_user_indexes \
                WHERE indexrelname = 'txoutbox_messages_due'";
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    let before = count(&client, read).await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(
        db.relay()?
            .config(
                RelayConfig::default()
                    .with_batch_size(50)
                    .with_concurrency(50),
            )
            .sink("email", sink.clone())
            .sink("events", RecordingSink::new())
            .build()?,
    );
    assert_eq!(sink.wait_for(2000, Duration::from_secs(60)).await, 2000);
    // The rows behind the dead head are out of the due range: a claim's index range scan
    // (`next_attempt_at <= now()`) no longer reaches them.
    // (Every `events` row but the dead head is behind it.)
    let still_due = due(&client, "events").await?;
    relay.stop().await?;
    // The relay's backends report their statistics as they exit.
    other_sessions_ended(&client).await?;
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    let read = count(&client, read).await? - before;
    eprintln!("the claims read {read} entries of the due index");
    // For information: 40 claims of 50 that rescanned the 20 000 waiting rows each would read
    // 800 000 entries; how many dead entries a scan still meets depends on when Postgres can
    // prune them, so the figure is printed, not asserted.
    assert_eq!(still_due, 0, "every row behind the dead head was parked");
    assert_eq!(
        counts_for(&client, "events").await?,
        Counts {
            pending: 20_000,
            failed: 1,
            keys: 0,
            ..Counts::default()
        },
        "the rows behind the dead head still wait"
    );
    Ok(())
}

#[tokio::test]
async fn the_default_policy_at_most_once_applies_to_every_destination() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending(&mut client, "sms", "amo-default").await?;
    let at_most_once = DestinationPolicy {
        semantics: Semantics::AtMostOnce,
        ..DestinationPolicy::default()
    };
    let policy = at_most_once.clone();
    kill_after_a_call(&db, "sms", move |relay| relay.default_policy(policy)).await?;
    let second_sink = RecordingSink::new();
    let mut events = RelayEvents::new();
    let second = events.start(
        db.relay()?
            .sink("sms", second_sink.clone())
            .default_policy(at_most_once),
    )?;
    let unknown = wait_until(&client, |c| c.unknown >= 1).await?.unknown;
    // Two claims end after the row became unknown: the second began after it. A delivery they
    // started would be finished by the stop.
    events.claims(2).await?;
    second.stop().await?;
    assert_eq!(unknown, 1);
    assert_eq!(second_sink.count(), 0, "never redelivered blindly");
    Ok(())
}

#[tokio::test]
async fn an_at_most_once_call_without_an_answer_is_unknown_and_not_repeated() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending(&mut client, "sms", "no-answer").await?;
    pending(&mut client, "push", "retried").await?;
    let sms = Failing(
        RecordingSink::new(),
        DeliveryError::indeterminate("timed out after sending"),
    );
    let push = txoutbox_test_support::relay::ScriptedSink::new([Err(
        DeliveryError::indeterminate("timed out after sending"),
    )]);
    let mut events = RelayEvents::new();
    let relay = events.start(
        db.relay()?
            .sink("sms", sms.clone())
            .sink("push", push.clone())
            .policy(
                "sms",
                DestinationPolicy {
                    semantics: Semantics::AtMostOnce,
                    ..quick_retry(5)
                },
            )
            .policy("push", quick_retry(5)),
    )?;
    let reached = wait_until(&client, |c| c.unknown >= 1 && c.delivered >= 1).await?;
    // A claim that began after both outcomes were written: had it taken a row again, the stop
    // would let its call finish.
    events.claims(2).await?;
    relay.stop().await?;
    assert_eq!(reached.unknown, 1);
    assert_eq!(sms.0.count(), 1, "an at-most-once call is made once");
    assert_eq!(
        reached.delivered, 1,
        "an at-least-once one is retried with its key"
    );
    assert_eq!(push.recorder.count(), 2);
    Ok(())
}

#[test]
fn a_sink_whose_timeout_does_not_fit_in_the_lease_is_refused() -> TestResult {
    struct Slow;
    #[async_trait::async_trait]
    impl Sink for Slow {
        async fn deliver(&self, _: &Delivery) -> Result<Receipt, DeliveryError> {
            Ok(Receipt::none())
        }
        fn timeout(&self) -> Option<Duration> {
            Some(Duration::from_secs(20))
        }
    }
    let pg: tokio_postgres::Config = "host=127.0.0.1 user=postgres".parse()?;
    let refused = txoutbox::relay::Relay::builder(pg.clone())
        .config(RelayConfig::default().with_lease(Duration::from_secs(10)))
        .sink("email", Slow)
        .build();
    let Err(txoutbox::Error::Config(line)) = refused else {
        anyhow::bail!("a 10 s lease with a 20 s sink was accepted");
    };
    assert!(
        line.starts_with("lease: 10s") && line.contains("\"email\"") && !line.contains('\n'),
        "{line}"
    );
    assert!(txoutbox::relay::Relay::builder(pg.clone())
        .sink("email", Slow)
        .build()
        .is_ok());
    let capped = txoutbox::relay::Relay::builder(pg)
        .policy(
            "email",
            DestinationPolicy {
                retry: RetryPolicy {
                    base: Duration::from_secs(60),
                    cap: Duration::from_secs(1),
                    max_attempts: 3,
                },
                ..DestinationPolicy::default()
            },
        )
        .build();
    assert!(
        matches!(&capped, Err(txoutbox::Error::Config(line)) if line.contains("below the base")),
        "{:?}",
        capped.err()
    );
    Ok(())
}

#[tokio::test]
async fn a_failing_hook_keeps_the_attempt_and_its_receipt_in_the_log() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    charges_table(&client, &["hooked"]).await?;
    pending(&mut client, "stripe", "hooked").await?;
    let hook = MarkCharge::failing();
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(
        db.relay()?
            .sink("stripe", sink.clone())
            .policy("stripe", quick_retry(5))
            .hook("stripe", hook.clone())
            .build()?,
    );
    wait_until(&client, |c| c.attempts >= 1).await?;
    hook.fail.store(false, Ordering::Relaxed);
    let delivered = wait_until(&client, |c| c.delivered >= 1).await?.delivered;
    relay.stop().await?;
    assert_eq!(delivered, 1);
    let row = client
        .query_one(
            "SELECT outcome, receipt, error FROM txoutbox_attempts ORDER BY finished_at LIMIT 1",
            &[],
        )
        .await?;
    let first: (String, Option<String>, Option<String>) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(first.0, "retry");
    assert_eq!(
        first.1.as_deref(),
        Some("ok:hooked"),
        "the downstream's receipt is kept"
    );
    assert!(first
        .2
        .as_deref()
        .is_some_and(|e| e.contains("the completion hook failed")
            && e.contains("the charges table is locked")));
    assert_eq!(charge_status(&client, "hooked").await?, "succeeded");
    Ok(())
}

#[tokio::test]
async fn a_slow_hook_does_not_hold_other_completions() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    charges_table(&client, &["slow-hook"]).await?;
    pending(&mut client, "stripe", "slow-hook").await?;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let hook = MarkCharge::gated(gate.clone());
    let relay = RunningRelay::start(
        db.relay()?
            .sink("stripe", RecordingSink::new())
            .sink("email", RecordingSink::new())
            .hook("stripe", hook.clone())
            .build()?,
    );
    tokio::time::timeout(Duration::from_secs(10), hook.entered.notified()).await?;
    pending_many(&mut client, "email", "meanwhile", 20).await?;
    // The stripe row cannot be delivered while its hook waits: what is delivered is email's.
    wait_until(&client, |c| c.delivered >= 20).await?;
    let delivered = counts_for(&client, "email").await?.delivered;
    gate.add_permits(1);
    eventually_async("the charge is marked", || async {
        Ok(charge_status(&client, "slow-hook").await? != "pending")
    })
    .await?;
    relay.stop().await?;
    assert_eq!(delivered, 20, "completed while the hook was still running");
    assert_eq!(charge_status(&client, "slow-hook").await?, "succeeded");
    Ok(())
}

#[tokio::test]
async fn a_statement_timeout_set_on_the_role_does_not_stop_the_relay() -> TestResult {
    let (db, client) = db_with_pending("email", "row", 3_000).await?;
    // Every new session of this role in this database: 1 ms, less than claiming 500 rows takes.
    client
        .batch_execute(&format!(
            "ALTER ROLE CURRENT_USER IN DATABASE \"{}\" SET statement_timeout = '1ms'",
            db.info().dbname()
        ))
        .await?;
    // The role's setting reaches a plain session: a 50 ms sleep there is cancelled. (Any
    // statement may be, on a slow machine: the probe asserts the cancellation, not a reading.)
    let probe = db.connect().await?;
    let slept = probe.batch_execute("SELECT pg_sleep(0.05)").await;
    let code = slept.as_ref().err().and_then(|e| e.code()).cloned();
    assert_eq!(
        code,
        Some(tokio_postgres::error::SqlState::QUERY_CANCELED),
        "the role's 1 ms timeout reaches a plain session: {slept:?}"
    );
    drop(probe);

    let sink = RecordingSink::new();
    let relay = RunningRelay::start(
        db.relay()?
            .config(RelayConfig::default().with_batch_size(500))
            .sink("email", sink.clone())
            .build()?,
    );
    let delivered = wait_until(&client, |c| c.delivered >= 3_000)
        .await?
        .delivered;
    relay.stop().await?;
    assert_eq!(
        delivered, 3_000,
        "the relay claims and completes under its own timeout"
    );
    assert_eq!(sink.deliveries().len(), 3_000);
    Ok(())
}

#[tokio::test]
async fn a_claim_meeting_rows_behind_failed_heads_reads_them_by_index_not_the_whole_hot_table(
) -> TestResult {
    // 200 ordering keys whose head is dead-lettered, 20 000 due rows waiting behind them, due
    // before 2 000 free rows: every claim meets blocked rows first, as a relay does at start.
    let (_db, _client, sink, read) = drain_after(
        "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key, status, next_attempt_at) \
             SELECT gen_random_uuid(), 'email', '{}', 'head-' || i, 'key-' || i, 'failed', \
                 now() - interval '2 hours' FROM generate_series(1, 200) AS i; \
             INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key, next_attempt_at) \
             SELECT gen_random_uuid(), 'email', '{}', 'behind-' || i, 'key-' || (1 + i % 200), \
                 now() - interval '1 hour' FROM generate_series(1, 20000) AS i; \
             INSERT INTO txoutbox_messages (id, destination, payload, downstream_key) \
             SELECT gen_random_uuid(), 'email', '{}', 'free-' || i \
             FROM generate_series(1, 2000) AS i; \
             ANALYZE txoutbox_messages;",
        2_000,
    )
    .await?;
    let scanned = read.seq_rows;
    assert!(
        sink.deliveries()
            .iter()
            .all(|d| d.downstream_key.starts_with("free-")),
        "no row behind a failed head is delivered"
    );
    // 50 claims that each hashed the hot table twice would read about 2 200 000 rows.
    assert!(
        scanned < 100_000,
        "the claims read {scanned} rows of the hot table sequentially"
    );
    Ok(())
}

#[tokio::test]
async fn rows_behind_a_dead_head_are_parked_long_and_its_discard_frees_the_next_at_once(
) -> TestResult {
    // Key `dead`: a dead-lettered head and 3 rows behind it. Key `busy`: a head retrying later
    // (pending, not due) and 3 rows behind it.
    let (db, mut client) = test_db_with_sql(
        "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key, status, next_attempt_at) VALUES \
             ('00000000-0000-7000-8000-0000000000d0', 'events', '{}', 'dead-head', 'dead', \
                 'failed', now() - interval '1 hour'), \
             (gen_random_uuid(), 'events', '{}', 'busy-head', 'busy', 'pending', \
                 now() + interval '1 hour'); \
             INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key) \
             SELECT gen_random_uuid(), 'events', '{}', k || '-' || i, k \
             FROM generate_series(1, 3) AS i, unnest(ARRAY['dead', 'busy']) AS k;",
    )
    .await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("events", sink.clone()).build()?);
    let parked = "SELECT count(*) FROM txoutbox_messages WHERE ordering_key = $1 \
         AND downstream_key <> $1 || '-head' AND next_attempt_at > now() + make_interval(secs => $2)";
    let parked_over = |key: &'static str, secs: f64| {
        let client = &client;
        async move {
            let n: i64 = value_with(client, parked, &[&key, &secs]).await?;
            anyhow::Ok(n)
        }
    };
    eventually_async("the rows behind both heads are parked", || async {
        Ok(parked_over("dead", 0.0).await? >= 3 && parked_over("busy", 0.0).await? >= 3)
    })
    .await?;
    assert_eq!(
        parked_over("dead", 300.0).await?,
        3,
        "behind a dead head: parked for minutes"
    );
    assert_eq!(parked_over("busy", 0.0).await?, 3);
    assert_eq!(
        parked_over("busy", 60.0).await?,
        0,
        "behind a live head: parked for the short park only"
    );
    assert_eq!(sink.count(), 0);

    // The operator discards the dead head: the rows behind it flow at once, in order.
    txoutbox::admin::discard(
        &mut client,
        &txoutbox::admin::ReplaySelection::Ids(vec![uuid::Uuid::from_u128(
            0x0000_0000_0000_7000_8000_0000_0000_00d0,
        )]),
        &txoutbox::admin::DiscardOptions::new("test"),
    )
    .await?;
    assert_eq!(sink.wait_for(3, Duration::from_secs(20)).await, 3);
    relay.stop().await?;
    let keys: Vec<String> = sink.keys();
    assert_eq!(keys, ["dead-1", "dead-2", "dead-3"]);
    Ok(())
}

/// A dead-lettered head of ordering key `stuck` (id `…d0`, key `head`) and `behind` due rows
/// queued behind it (keys `behind-1`…), all due before anything enqueued after them.
async fn dead_head_with_a_queue(client: &tokio_postgres::Client, behind: i64) -> TestResult {
    client
        .execute(
            "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key, status, attempts, last_error, next_attempt_at) \
             VALUES ('00000000-0000-7000-8000-0000000000d0', 'events', '{}', 'head', 'stuck', \
                 'failed', 5, 'dead-lettered', now() - interval '2 hours')",
            &[],
        )
        .await?;
    client
        .execute(
            "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, \
                 ordering_key, next_attempt_at) \
             SELECT gen_random_uuid(), 'events', '{}', 'behind-' || i, 'stuck', \
                 now() - interval '1 hour' FROM generate_series(1, $1::bigint) AS i",
            &[&behind],
        )
        .await?;
    Ok(())
}

/// How many of the rows behind key `stuck`'s head are parked, and by how many claims (each
/// claim parks its rows until its own `now()` and a park, so one time is one claim).
async fn parked_behind_stuck(client: &tokio_postgres::Client) -> anyhow::Result<(i64, i64)> {
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT next_attempt_at) FROM txoutbox_messages \
             WHERE ordering_key = 'stuck' AND downstream_key <> 'head' \
                 AND next_attempt_at > now() + interval '5 minutes'",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

#[tokio::test]
async fn one_claim_parks_the_whole_queue_behind_a_dead_head_and_other_keys_flow_next() -> TestResult
{
    let (db, mut client) = test_db_with_client().await?;
    dead_head_with_a_queue(&client, 1_000).await?;
    pending_many(&mut client, "email", "other", 30).await?;
    let sink = RecordingSink::new();
    let events = RecordingSink::new();
    let relay = RunningRelay::start(
        db.relay()?
            .config(
                RelayConfig::default()
                    .with_batch_size(10)
                    .with_concurrency(10),
            )
            .sink("email", sink.clone())
            .sink("events", events.clone())
            .build()?,
    );
    assert_eq!(sink.wait_for(30, Duration::from_secs(60)).await, 30);
    relay.stop().await?;
    let (parked, claims) = parked_behind_stuck(&client).await?;
    assert_eq!(parked, 1_000, "every row behind the dead head is parked");
    // A claim of 10 reads 40 due rows: parking them 40 at a time took 25 claims before the
    // first row of another key was reached.
    assert!(
        claims <= 2,
        "the queue behind the dead head was parked by {claims} claims"
    );
    assert_eq!(
        events.count(),
        0,
        "no row behind the dead head is delivered"
    );
    Ok(())
}

#[tokio::test]
async fn a_replayed_dead_head_releases_its_parked_queue_in_order() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    dead_head_with_a_queue(&client, 5).await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("events", sink.clone()).build()?);
    eventually_async("the queue behind the dead head is parked", || async {
        Ok(parked_behind_stuck(&client).await?.0 >= 5)
    })
    .await?;
    assert_eq!(
        parked_behind_stuck(&client).await?.0,
        5,
        "the queue is parked"
    );
    txoutbox::admin::replay(
        &mut client,
        &txoutbox::admin::ReplaySelection::Ids(vec![uuid::Uuid::from_u128(
            0x0000_0000_0000_7000_8000_0000_0000_00d0,
        )]),
        &txoutbox::admin::ReplayOptions::default(),
        None,
    )
    .await?;
    assert_eq!(sink.wait_for(6, Duration::from_secs(30)).await, 6);
    relay.stop().await?;
    assert_eq!(
        sink.keys(),
        ["head", "behind-1", "behind-2", "behind-3", "behind-4", "behind-5"]
    );
    Ok(())
}

#[tokio::test]
async fn two_relays_park_a_dead_heads_queue_and_keep_a_live_key_in_order() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    dead_head_with_a_queue(&client, 2_000).await?;
    for i in 0..40 {
        let tx = client.transaction().await?;
        let message = OutboxMessage::new("events", &serde_json::json!({ "seq": i }))?
            .with_downstream_key(format!("live-{i}"))
            .with_ordering_key("live");
        enqueue(&tx, &[message]).await?;
        tx.commit().await?;
    }
    pending_many(&mut client, "events", "other", 40).await?;
    let sink = RecordingSink::new();
    let relays: Vec<RunningRelay> = (0..2)
        .map(|_| {
            Ok(RunningRelay::start(
                db.relay()?
                    .config(RelayConfig::default().with_batch_size(10))
                    .sink("events", sink.clone())
                    .build()?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(sink.wait_for(80, Duration::from_secs(60)).await, 80);
    for relay in relays {
        relay.stop().await?;
    }
    let deliveries = sink.deliveries();
    let live: Vec<i64> = deliveries
        .iter()
        .filter(|d| d.ordering_key.as_deref() == Some("live"))
        .map(|d| d.payload["seq"].as_i64().unwrap_or(-1))
        .collect();
    assert_eq!(
        live,
        (0..40).collect::<Vec<_>>(),
        "the live key in commit order"
    );
    assert!(
        deliveries
            .iter()
            .all(|d| d.ordering_key.as_deref() != Some("stuck")),
        "no row behind the dead head is delivered"
    );
    assert_eq!(parked_behind_stuck(&client).await?.0, 2_000);
    Ok(())
}

#[tokio::test]
async fn a_pause_reaches_a_relay_that_claims_without_flow_control_branches() -> TestResult {
    // A relay that bounds nothing itself claims with the lean statement while no destination
    // has a flow-control state; a pause made meanwhile must still hold from its commit on.
    let (db, mut client) = db_with_pending("email", "before", 5).await?;
    let sink = RecordingSink::new();
    let mut events = RelayEvents::new();
    let relay = events.start(db.relay()?.sink("email", sink.clone()))?;
    assert_eq!(sink.wait_for(5, Duration::from_secs(20)).await, 5);
    txoutbox::admin::pause_destination(&mut client, "email", "incident", Some("alice")).await?;
    pending_many(&mut client, "email", "paused", 5).await?;
    // Two claims end from now on, the second begun after the pause and the rows: neither takes
    // a row of the paused destination.
    events.clear();
    let since = events.seen().len();
    events.claims(2).await?;
    let claimed: Vec<_> = events.seen()[since..]
        .iter()
        .filter(|e| matches!(e, RelayEvent::Claimed { .. }))
        .collect();
    assert!(claimed.is_empty(), "claimed while paused: {claimed:?}");
    assert_eq!(sink.count(), 5, "the paused destination is not called");
    assert_eq!(counts(&client).await?.pending, 5, "the paused rows wait");
    for i in 0..5 {
        assert_outcomes(&client, &format!("paused-{i}"), []).await?;
    }
    txoutbox::admin::resume_destination(&mut client, "email", Some("bob")).await?;
    assert_eq!(sink.wait_for(10, Duration::from_secs(20)).await, 10);
    relay.stop().await?;
    Ok(())
}

/// Whether a statement's plan, as `EXPLAIN` shows it in `client`'s session, is compiled by JIT.
async fn plans_with_jit(client: &tokio_postgres::Client) -> Result<bool, tokio_postgres::Error> {
    let plan = client
        .simple_query("EXPLAIN SELECT count(*) FROM txoutbox_messages")
        .await?;
    Ok(plan.iter().any(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => {
            row.get(0).is_some_and(|line| line.contains("JIT"))
        }
        _ => false,
    }))
}

#[tokio::test]
async fn the_relay_never_compiles_its_statements_with_jit() -> TestResult {
    // The claim's estimated cost grows with the backlog; past `jit_above_cost` every claim spent
    // far longer compiling than running. Here the role JIT-compiles every statement.
    let (db, client) = test_db_with_client().await?;
    client
        .batch_execute(&format!(
            "ALTER ROLE CURRENT_USER IN DATABASE \"{}\" SET jit = on; \
             ALTER ROLE CURRENT_USER IN DATABASE \"{0}\" SET jit_above_cost = 0",
            db.info().dbname()
        ))
        .await?;
    let probe = db.connect().await?;
    let available: bool = value(&probe, "SELECT pg_jit_available()").await?;
    assert_eq!(
        plans_with_jit(&probe).await?,
        available,
        "a plain session of the role compiles with JIT wherever the server can"
    );
    let relay = db.relay()?.sink("email", RecordingSink::new()).build()?;
    let conn = relay.pool().get().await?;
    let jit: String = value(&**conn, "SHOW jit").await?;
    assert_eq!(jit, "off", "the relay's sessions turn JIT off");
    assert!(!plans_with_jit(&conn).await?);
    Ok(())
}

#[tokio::test]
async fn every_attempt_row_names_its_destination() -> TestResult {
    let (db, mut client) = db_with_pending("email", "ok", 3).await?;
    pending_many(&mut client, "webhook", "bad", 2).await?;
    let relay = RunningRelay::start(
        db.relay()?
            .sink("email", RecordingSink::new())
            .sink(
                "webhook",
                Failing(RecordingSink::new(), DeliveryError::retryable("HTTP 503")),
            )
            .policy("webhook", quick_retry(2))
            .build()?,
    );
    wait_until(&client, |c| c.failed >= 2).await?;
    relay.stop().await?;
    let by_destination: Vec<(String, String, i64)> = client
        .query(
            "SELECT COALESCE(destination, '(none)'), outcome, count(*) FROM txoutbox_attempts \
             GROUP BY 1, 2 ORDER BY 1, 2",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        by_destination,
        [
            ("email".to_owned(), "delivered".to_owned(), 3),
            ("webhook".to_owned(), "failed".to_owned(), 2),
            ("webhook".to_owned(), "retry".to_owned(), 2),
        ],
        "the failure rate of `stats` reads the attempt log alone"
    );
    Ok(())
}

#[tokio::test]
async fn a_claim_reads_the_due_index_in_order_not_the_whole_hot_table() -> TestResult {
    // One destination, 20 000 due rows: the planner's statistics say every row has the same
    // destination, which once made it sort the whole table on every claim.
    let (_db, _client, _, read) = drain_after(
        "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key) \
             SELECT gen_random_uuid(), 'email', '{}', 'row-' || i \
             FROM generate_series(1, 20000) AS i; \
             ANALYZE txoutbox_messages;",
        20_000,
    )
    .await?;
    let scanned = read.seq_rows;
    // 200 claims that each sorted the hot table would read about 2 000 000 rows sequentially.
    assert!(
        scanned < 100_000,
        "the claims read {scanned} rows of the hot table sequentially"
    );
    Ok(())
}

#[tokio::test]
async fn a_backlog_never_analyzed_is_claimed_in_index_order_and_completed_by_key() -> TestResult {
    // 20 000 due rows in a table never analyzed (a new installation's first burst; autovacuum
    // held off): the planner's guess is a dozen pending rows, and a claim that takes it at its
    // word reads them all with a bitmap scan and sorts them, on every claim. The relay gathers
    // the statistics itself.
    let (_db, client, _, read) = drain_after(
        "ALTER TABLE txoutbox_messages SET (autovacuum_enabled = false); \
             INSERT INTO txoutbox_messages (id, destination, payload, downstream_key) \
             SELECT gen_random_uuid(), 'email', '{}', 'row-' || i \
             FROM generate_series(1, 20000) AS i;",
        20_000,
    )
    .await?;
    let analyzed = count(
        &client,
        "SELECT count(*) FROM pg_stats WHERE tablename = 'txoutbox_messages' \
         AND attname = 'status'",
    )
    .await?;
    assert_eq!(analyzed, 1, "the relay analyzed the table");
    // In index order, a claim of 100 reads its 400 candidates: 4 entries a row. Sorting the
    // backlog read about 300 a row here.
    assert!(
        read.due_entries < 20_000 * 100,
        "the claims read {} entries of the due index for 20 000 rows",
        read.due_entries
    );
    // A completion finds each row by one lookup of its key. Testing the batch's ids as an index
    // condition beside the join made every lookup descend the index once per id in the batch:
    // about one descent per row and batch member.
    assert!(
        read.pkey_scans < 20_000 * 8,
        "the relay descended the primary key {} times for 20 000 rows",
        read.pkey_scans
    );
    Ok(())
}

#[tokio::test]
async fn a_relay_whose_role_cannot_analyze_the_table_still_delivers_everything() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    // A role that may read and write the tables but does not own them: ANALYZE warns and skips.
    let role = format!("relay_{}", db.info().dbname().replace('-', "_"));
    client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; \
             GRANT USAGE ON SCHEMA public TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}; \
             GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}; \
             ALTER TABLE txoutbox_messages SET (autovacuum_enabled = false); \
             INSERT INTO txoutbox_messages (id, destination, payload, downstream_key) \
             SELECT gen_random_uuid(), 'email', '{{}}', 'row-' || i \
             FROM generate_series(1, 3000) AS i;"
        ))
        .await?;
    let mut pg = db.config()?;
    pg.config_mut().user(&role);
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(
        txoutbox::relay::Relay::builder(pg)
            .config(RelayConfig::default().with_batch_size(100))
            .sink("email", sink.clone())
            .build()?,
    );
    assert_eq!(sink.wait_for(3_000, Duration::from_secs(60)).await, 3_000);
    relay.stop().await?;
    let analyzed = count(
        &client,
        "SELECT count(*) FROM pg_stats WHERE tablename = 'txoutbox_messages'",
    )
    .await?;
    assert_eq!(analyzed, 0, "the role could not analyze the table");
    assert_eq!(count(&client, "txoutbox_messages").await?, 0);
    client
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await?;
    Ok(())
}

/// Answers its first call at once and holds every later one until `release`.
#[derive(Clone)]
struct HeldAfterFirst {
    calls: Arc<AtomicUsize>,
    release: Arc<tokio::sync::Semaphore>,
}

#[async_trait::async_trait]
impl Sink for HeldAfterFirst {
    async fn deliver(&self, _: &Delivery) -> Result<Receipt, DeliveryError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            let _ = self.release.acquire().await.map(|p| p.forget());
        }
        Ok(Receipt::none())
    }
}

#[tokio::test]
async fn rows_waiting_for_a_slot_are_given_back_uncalled_at_shutdown() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let sink = HeldAfterFirst {
        calls: Arc::default(),
        release: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let mut events = RelayEvents::new();
    let relay = events.start_with(
        db.relay()?.sink("sms", sink.clone()),
        RelayConfig::default()
            .with_concurrency(1)
            .with_batch_size(20)
            .with_poll_interval(Duration::from_millis(50)),
    )?;
    // A first call answered at once: the relay knows its sinks are fast, so its next claim takes
    // more rows than its one slot, and the rest wait in its queue.
    pending(&mut client, "sms", "first").await?;
    wait_until(&client, |c| c.delivered >= 1).await?;
    pending_many(&mut client, "sms", "queued", 20).await?;
    wait_until(&client, |c| c.in_flight >= 20).await?;
    assert_eq!(
        sink.calls.load(Ordering::SeqCst),
        2,
        "one call runs, 19 rows wait"
    );
    // The running call ends during the shutdown's grace period: the slot it frees is not used.
    let release = sink.release.clone();
    let released = tokio::spawn(async move {
        events.wait_for(|e| *e == RelayEvent::Stopping).await?;
        release.add_permits(100);
        anyhow::Ok(())
    });
    relay.stop().await?;
    released.await??;
    assert_eq!(
        sink.calls.load(Ordering::SeqCst),
        2,
        "no queued row was called"
    );
    assert_eq!(count(&client, "txoutbox_delivered").await?, 2);
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM txoutbox_messages \
             WHERE status = 'pending' AND attempts = 0 AND lease_token IS NULL"
        )
        .await?,
        19,
        "the queued rows are pending again, their attempt not counted"
    );
    assert_eq!(count(&client, "txoutbox_attempt_log").await?, 0);
    Ok(())
}
