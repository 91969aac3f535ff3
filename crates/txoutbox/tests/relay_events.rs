//! The relay's test events: what a running relay reports as it claims, completes, takes back
//! leases, fans out deferred effects and stops, so that tests wait for what it did instead of
//! sleeping.

use std::time::Duration;

use txoutbox::admin::MessageStatus;
use txoutbox::relay::{RelayEvent, WAKE_CHANNEL};
use txoutbox::{OutboxMessage, Scope};
use txoutbox_test_support::factory::{message, pending_many};
use txoutbox_test_support::relay::{relay_config, RecordingSink, RunningRelay};
use txoutbox_test_support::request::empty_created;
use txoutbox_test_support::request::{charge_fingerprint, key, new_claim};
use txoutbox_test_support::{
    counts, eventually_async, is_claim, test_db, test_db_with_client, RelayEvents, TestDb,
};

type TestResult = anyhow::Result<()>;

/// A relay delivering `email` rows to a recording sink, its events sent to the first value.
fn watched(db: &TestDb) -> anyhow::Result<(RelayEvents, RecordingSink, RunningRelay)> {
    let events = RelayEvents::new();
    let sink = RecordingSink::new();
    let relay = events.start(db.relay()?.sink("email", sink.clone()))?;
    Ok((events, sink, relay))
}

#[tokio::test]
async fn a_relay_reports_its_claims_its_completions_an_idle_claim_and_its_stop() -> TestResult {
    let db = test_db().await?;
    pending_many(&db, "email", "k", 3).await?;
    let (mut events, sink, relay) = watched(&db)?;
    let claimed = events
        .wait_for(|e| matches!(e, RelayEvent::Claimed { .. }))
        .await?;
    assert_eq!(claimed, RelayEvent::Claimed { n: 3 });
    let mut completed = 0;
    while completed < 3 {
        if let RelayEvent::Completed { n } = events
            .wait_for(|e| matches!(e, RelayEvent::Completed { .. }))
            .await?
        {
            completed += n;
        }
    }
    assert_eq!(completed, 3, "each claimed row's outcome is completed once");
    // The outcomes are written when the completer reports them.
    assert_eq!(counts(&db.connect().await?).await?.delivered, 3);
    events.idle().await?;
    relay.stop().await?;
    events.wait_for(|e| *e == RelayEvent::Stopping).await?;
    assert_eq!(sink.count(), 3);
    let claims = events.seen().iter().filter(|e| is_claim(e)).count();
    assert!(claims >= 2, "a claim with rows, then an idle one: {claims}");
    Ok(())
}

#[tokio::test]
async fn a_relay_reports_the_expired_leases_it_takes_back() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    message(&db)
        .destination("email")
        .key("expired")
        .status(MessageStatus::InFlight)
        .create()
        .await?;
    client
        .execute(
            "UPDATE txoutbox_messages SET lease_owner = 'gone', lease_token = 1, \
             attempts = 1, attempt_started_at = now() - interval '1 minute', \
             lease_expires_at = now() - interval '1 second'",
            &[],
        )
        .await?;
    let (mut events, sink, relay) = watched(&db)?;
    assert_eq!(events.reclaimed().await?, 1);
    events
        .wait_for(|e| *e == RelayEvent::Claimed { n: 1 })
        .await?;
    relay.stop().await?;
    assert_eq!(sink.keys(), ["expired"]);
    Ok(())
}

#[tokio::test]
async fn a_relay_reports_the_deferred_effects_it_fans_out() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let scope = Scope::new("charges")?.with_deferred_effects();
    for name in ["k-1", "k-2"] {
        let tx = client.transaction().await?;
        let mut claim = new_claim(&tx, &scope, &key(name), &charge_fingerprint(1)).await?;
        claim.enqueue(
            "receipt",
            OutboxMessage::new("email", &serde_json::json!({"key": name}))?,
        )?;
        claim.complete(&tx, &empty_created()).await?;
        tx.commit().await?;
    }
    let (mut events, sink, relay) = watched(&db)?;
    let fanned = events
        .wait_for(|e| matches!(e, RelayEvent::FannedOut { .. }))
        .await?;
    assert_eq!(fanned, RelayEvent::FannedOut { n: 2 });
    assert_eq!(sink.wait_for(2, Duration::from_secs(10)).await, 2);
    relay.stop().await?;
    Ok(())
}

/// The relay's claims waiting on a table lock (`messages/claim_unbounded.sql` or
/// `messages/claim.sql`, known by their start: `pg_stat_activity` cuts long statements short).
async fn claims_waiting(client: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' \
             AND (query LIKE 'WITH guard AS%' OR query LIKE 'WITH flow AS%')",
            &[],
        )
        .await?
        .get(0))
}

#[tokio::test]
async fn a_wake_up_while_a_claim_is_out_sends_another_claim_at_once() -> TestResult {
    let db = test_db().await?;
    let mut events = RelayEvents::new();
    // No poll while the test runs: only the wake-ups send claims.
    let config =
        txoutbox_test_support::relay::relay_config().with_poll_interval(Duration::from_secs(60));
    let relay = db
        .relay()?
        .config(events.config(config))
        .sink("email", RecordingSink::new())
        .build()?;
    let waker = relay.clone();
    let running = RunningRelay::start(relay);
    events.idle().await?;
    // Hold the claims on the server: a claim's UPDATE waits for this lock.
    let locker = db.connect().await?;
    locker
        .batch_execute("BEGIN; LOCK TABLE txoutbox_messages IN SHARE MODE")
        .await?;
    let watcher = db.connect().await?;
    waker.wake();
    eventually_async("the first claim waits on the lock", || async {
        Ok(claims_waiting(&watcher).await? == 1)
    })
    .await?;
    // Rows committed now are not in the waiting claim's snapshot: a wake-up sends another.
    waker.wake();
    eventually_async("a second claim is out beside the first", || async {
        Ok(claims_waiting(&watcher).await? == 2)
    })
    .await?;
    locker.batch_execute("ROLLBACK").await?;
    events.idle().await?;
    running.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_claim_does_not_wait_for_the_fan_out_beside_it() -> TestResult {
    let db = test_db().await?;
    let (mut events, sink, relay) = watched(&db)?;
    events.idle().await?;
    // Hold every fan-out on the server: it locks key rows for update, which this lock forbids.
    let locker = db.connect().await?;
    locker
        .batch_execute("BEGIN; LOCK TABLE txoutbox_idempotency_keys IN EXCLUSIVE MODE")
        .await?;
    pending_many(&db, "email", "k", 2).await?;
    // The next poll fans out (held) and claims (not held): the rows are delivered.
    assert_eq!(sink.wait_for(2, Duration::from_secs(10)).await, 2);
    locker.batch_execute("ROLLBACK").await?;
    relay.stop().await?;
    Ok(())
}

/// A relay whose fan-outs find no deferred effects answers each wake-up with a claim and no
/// fan-out beside it: it looks for deferred effects at most once per 50 ms between wake-ups
/// (and at its poll, an hour here), not once per commit.
#[tokio::test]
async fn wake_ups_without_deferred_effects_do_not_each_send_a_fan_out() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let mut events = RelayEvents::new();
    let relay = events.start_with(
        db.relay()?.sink("email", RecordingSink::new()),
        relay_config().with_poll_interval(Duration::from_secs(3600)),
    )?;
    events.idle().await?;
    events.clear();
    let from = events.seen().len();
    let started = std::time::Instant::now();
    for _ in 0..100 {
        client
            .batch_execute(&format!("NOTIFY {WAKE_CHANNEL}"))
            .await?;
        // The next idle claim not yet waited for (the wake-up's, or one before it): `idle()`
        // would forget one that ended before it was called, and wait for a wake-up that never
        // comes.
        events.wait_for(|e| *e == RelayEvent::Idle).await?;
    }
    relay.stop().await?;
    events.wait_for(|e| *e == RelayEvent::Stopping).await?;
    let elapsed = started.elapsed();
    let lookups = events.seen()[from..]
        .iter()
        .filter(|e| **e == RelayEvent::LookedForEffects)
        .count();
    let bound = elapsed.as_millis() as usize / 50 + 2;
    assert!(
        lookups <= bound,
        "{lookups} fan-outs for 100 wake-ups in {elapsed:?} (at most {bound})"
    );
    Ok(())
}
