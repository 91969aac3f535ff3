//! Rows of one ordering key behind an earlier row: written waiting, never due nor touched by a
//! claim while the row ahead is in the hot table, due the moment it leaves (delivered,
//! discarded, replayed and delivered), including when it leaves while the row behind is being
//! enqueued.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;
use txoutbox::admin::{self, DiscardOptions, MessageStatus, ReplayOptions, ReplaySelection};
use txoutbox::relay::RelayConfig;
use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};
use txoutbox::{enqueue, OutboxMessage};
use txoutbox_test_support::relay::{relay_config, FailsKey, RecordingSink, RunningRelay};
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::select::{column, value};
use txoutbox_test_support::{
    eventually_async, status, test_db_with_client, wait_until, RelayEvents, TestDb,
};

type TestResult = anyhow::Result<()>;

/// An `events` message with downstream key `{key}-{n}` and ordering key `key`.
fn ordered(key: &str, n: i32) -> anyhow::Result<OutboxMessage> {
    Ok(
        OutboxMessage::new("events", &serde_json::json!({ "n": n }))?
            .with_downstream_key(format!("{key}-{n}"))
            .with_ordering_key(key),
    )
}

/// The downstream keys of the rows a claim could take now (pending and due), in key order.
async fn due(client: &Client) -> anyhow::Result<Vec<String>> {
    column(
        client,
        "SELECT downstream_key FROM txoutbox_messages \
         WHERE status = 'pending' AND next_attempt_at <= now() ORDER BY downstream_key",
    )
    .await
}

/// The test relay's timings with the sweep of waiting rows every 50 ms.
fn sweeping() -> RelayConfig {
    relay_config().with_stranded_sweep_interval(Duration::from_millis(50))
}

/// A relay (`config`) started with `sink` for the `events` destination.
fn events_relay(db: &TestDb, config: RelayConfig, sink: impl Sink) -> anyhow::Result<RunningRelay> {
    Ok(RunningRelay::start(
        db.relay()?.config(config).sink("events", sink).build()?,
    ))
}

/// Runs a relay (`config`) that records the `events` deliveries until `n` were made, then stops it; the
/// downstream keys, in call order.
async fn deliver_events(db: &TestDb, config: RelayConfig, n: usize) -> anyhow::Result<Vec<String>> {
    let sink = RecordingSink::new();
    let relay = events_relay(db, config, sink.clone())?;
    assert_eq!(sink.wait_for(n, Duration::from_secs(20)).await, n);
    relay.stop().await?;
    Ok(sink.keys())
}

#[tokio::test]
async fn rows_behind_a_live_head_are_not_due_and_follow_it_in_order() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    enqueue_committed(&mut client, &[ordered("k", 0)?]).await?;
    enqueue_committed(&mut client, &[ordered("k", 1)?, ordered("k", 2)?]).await?;
    // A batch whose key has no row yet: its first row is due, the next waits behind it.
    enqueue_committed(&mut client, &[ordered("j", 0)?, ordered("j", 1)?]).await?;
    assert_eq!(due(&client).await?, ["j-0", "k-0"]);

    let keys = deliver_events(&db, relay_config(), 5).await?;
    let of = |k: &str| -> Vec<&String> { keys.iter().filter(|d| d.starts_with(k)).collect() };
    assert_eq!(of("k-"), ["k-0", "k-1", "k-2"]);
    assert_eq!(of("j-"), ["j-0", "j-1"]);
    Ok(())
}

/// The row versions of the rows behind `a-0` (`xmin`, which every update changes), in order.
async fn versions_behind_a0(client: &Client) -> anyhow::Result<Vec<String>> {
    column(
        client,
        "SELECT xmin::text FROM txoutbox_messages \
         WHERE ordering_key = 'a' AND downstream_key <> 'a-0' ORDER BY seq",
    )
    .await
}

/// `a-0`, dead-lettered by a relay with 50 rows behind it while 30 rows of other keys were
/// delivered, and what that left: the relay is stopped.
struct DeadHead {
    /// The id of `a-0`.
    id: uuid::Uuid,
    /// The relay's sink.
    sink: FailsKey,
    /// The versions of the rows behind `a-0` before the relay ran ([`versions_behind_a0`]).
    versions: Vec<String>,
}

async fn dead_head_with_rows_behind(client: &mut Client, db: &TestDb) -> anyhow::Result<DeadHead> {
    let behind: Vec<OutboxMessage> = (0..=50)
        .map(|n| ordered("a", n))
        .collect::<Result<_, _>>()?;
    enqueue_committed(client, &behind).await?;
    let others: Vec<OutboxMessage> = (0..30)
        .map(|n| ordered(&format!("b{}", n % 3), n))
        .collect::<Result<_, _>>()?;
    enqueue_committed(client, &others).await?;
    let versions = versions_behind_a0(client).await?;

    let sink = FailsKey::new("a-0");
    let mut events = RelayEvents::new();
    let relay = events.start(db.relay()?.sink("events", sink.clone()))?;
    assert_eq!(
        sink.delivered.wait_for(30, Duration::from_secs(20)).await,
        30
    );
    wait_until(client, |c| c.failed >= 1).await?;
    // Two more claims, the second begun after the head was dead-lettered.
    events.claims(2).await?;
    relay.stop().await?;
    let id = value(
        client,
        "SELECT id FROM txoutbox_messages WHERE downstream_key = 'a-0'",
    )
    .await?;
    Ok(DeadHead { id, sink, versions })
}

#[tokio::test]
async fn rows_behind_a_dead_head_are_never_claimed_nor_updated_while_other_keys_drain() -> TestResult
{
    let (db, mut client) = test_db_with_client().await?;
    let DeadHead { sink, versions, .. } = dead_head_with_rows_behind(&mut client, &db).await?;
    assert!(
        sink.delivered.keys().iter().all(|k| !k.starts_with("a-")),
        "nothing behind the dead head was delivered"
    );
    assert_eq!(status(&client, "a-0").await?, Some(MessageStatus::Failed));
    let pending: i64 = value(
        &client,
        "SELECT count(*) FROM txoutbox_messages WHERE ordering_key = 'a' AND status = 'pending'",
    )
    .await?;
    assert_eq!(pending, 50);
    assert_eq!(
        versions_behind_a0(&client).await?,
        versions,
        "no claim wrote a row behind the dead head"
    );
    Ok(())
}

#[tokio::test]
async fn discarding_a_dead_head_delivers_the_rows_behind_it_in_order() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let head = dead_head_with_rows_behind(&mut client, &db).await?.id;
    let options = DiscardOptions::new("refunded by hand");
    admin::discard(&mut client, &ReplaySelection::Ids(vec![head]), &options).await?;
    assert_eq!(due(&client).await?, ["a-1"]);

    let expected: Vec<String> = (1..=50).map(|n| format!("a-{n}")).collect();
    assert_eq!(deliver_events(&db, relay_config(), 50).await?, expected);
    Ok(())
}

#[tokio::test]
async fn a_replayed_dead_head_is_delivered_then_the_rows_behind_it_in_order() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let head = dead_head_with_rows_behind(&mut client, &db).await?.id;
    admin::replay(
        &mut client,
        &ReplaySelection::Ids(vec![head]),
        &ReplayOptions::default(),
        None,
    )
    .await?;
    assert_eq!(due(&client).await?, ["a-0"]);

    let expected: Vec<String> = (0..=50).map(|n| format!("a-{n}")).collect();
    assert_eq!(deliver_events(&db, relay_config(), 51).await?, expected);
    Ok(())
}

/// Holds the delivery of `k-0` until `release` is notified; records every delivery.
#[derive(Clone, Default)]
struct HoldK0 {
    release: Arc<tokio::sync::Notify>,
    sink: RecordingSink,
}

#[async_trait::async_trait]
impl Sink for HoldK0 {
    async fn deliver(&self, d: &Delivery) -> Result<Receipt, DeliveryError> {
        if d.downstream_key == "k-0" {
            self.release.notified().await;
        }
        self.sink.deliver(d).await
    }
}

/// `k-0` committed and taken by a relay (`config`) whose sink holds it, `k-1` enqueued by a
/// transaction of `writer` left open, then `k-0` let through: the relay, its sink and that
/// transaction.
async fn k0_completing_while_k1_is_enqueued<'w>(
    db: &TestDb,
    client: &mut Client,
    writer: &'w mut Client,
    config: RelayConfig,
) -> anyhow::Result<(RunningRelay, HoldK0, tokio_postgres::Transaction<'w>)> {
    enqueue_committed(client, &[ordered("k", 0)?]).await?;
    let sink = HoldK0::default();
    let relay = events_relay(db, config, sink.clone())?;
    wait_until(client, |c| c.in_flight >= 1).await?;
    let enqueuing = writer.transaction().await?;
    enqueue(&enqueuing, &[ordered("k", 1)?]).await?;
    sink.release.notify_one();
    Ok((relay, sink, enqueuing))
}

/// The enqueue of `k-1` saw `k-0` and wrote `k-1` waiting; `k-0` is delivered before that
/// enqueue commits. The completion must not decide which row comes next from a snapshot that
/// misses `k-1`: it waits for the enqueue's ordering-key lock, so `k-1` is due once both
/// committed. (The relay's sweep of waiting rows, off here, would only find it later; the wait
/// for the lock is long here so that a slow test cannot outlast it.)
#[tokio::test]
async fn a_row_enqueued_while_its_head_is_completed_is_due_once_both_commit() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let mut writer = db.connect().await?;
    let config = relay_config()
        .with_stranded_sweep_interval(Duration::ZERO)
        .with_ordering_lock_wait(Duration::from_secs(60));
    let (relay, sink, enqueuing) =
        k0_completing_while_k1_is_enqueued(&db, &mut client, &mut writer, config).await?;
    // The completion of k-0 either waits for the enqueue's lock or, without that fence, has
    // already committed: either way it ran while k-1 was not committed.
    eventually_async("k-0's completion waited or went through", || async {
        let waiting: i64 = value(
            &client,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        )
        .await?;
        Ok(waiting > 0 || status(&client, "k-0").await? == Some(MessageStatus::Delivered))
    })
    .await?;
    enqueuing.commit().await?;
    eventually_async("k-0 is delivered", || async {
        Ok(status(&client, "k-0").await? == Some(MessageStatus::Delivered))
    })
    .await?;
    let waiting: i64 = value(
        &client,
        "SELECT count(*) FROM txoutbox_messages \
         WHERE downstream_key = 'k-1' AND status = 'pending' AND next_attempt_at > now()",
    )
    .await?;
    assert_eq!(waiting, 0, "k-1 is due, claimed or delivered, not waiting");
    assert_eq!(sink.sink.wait_for(2, Duration::from_secs(20)).await, 2);
    relay.stop().await?;
    assert_eq!(sink.sink.keys(), ["k-0", "k-1"]);
    Ok(())
}

/// An enqueue transaction that holds its key's lock for long (here: until the test commits it)
/// does not hold the completion of the key's head back: the completion waits for the lock
/// (`ordering_lock_wait`, 200 ms), then completes without it, and the relay's sweep makes the
/// row that enqueue wrote waiting due.
#[tokio::test]
async fn a_completion_does_not_wait_for_an_enqueue_that_holds_its_key() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let mut writer = db.connect().await?;
    let (relay, sink, enqueuing) =
        k0_completing_while_k1_is_enqueued(&db, &mut client, &mut writer, sweeping()).await?;
    eventually_async(
        "k-0 is delivered while the enqueue holds its key",
        || async { Ok(status(&client, "k-0").await? == Some(MessageStatus::Delivered)) },
    )
    .await?;
    enqueuing.commit().await?;
    assert_eq!(sink.sink.wait_for(2, Duration::from_secs(20)).await, 2);
    relay.stop().await?;
    assert_eq!(sink.sink.keys(), ["k-0", "k-1"]);
    Ok(())
}

/// Deletes the row with downstream key `key` as a person at a `psql` prompt would.
async fn delete_by_hand(client: &Client, key: &str) -> anyhow::Result<()> {
    client
        .execute(
            "DELETE FROM txoutbox_messages WHERE downstream_key = $1",
            &[&key],
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_waiting_row_whose_head_was_deleted_by_hand_is_made_due_by_the_sweep() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    enqueue_committed(&mut client, &[ordered("k", 0)?, ordered("k", 1)?]).await?;
    enqueue_committed(&mut client, &[ordered("j", 0)?, ordered("j", 1)?]).await?;
    delete_by_hand(&client, "k-0").await?;
    assert_eq!(due(&client).await?, ["j-0"]);
    let unparked = txoutbox::relay::unpark_stranded(&db.pool(1)?).await?;
    assert_eq!(unparked, 1);
    assert_eq!(due(&client).await?, ["j-0", "k-1"]);
    Ok(())
}

#[tokio::test]
async fn a_relay_sweeps_waiting_rows_left_with_nothing_ahead() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    enqueue_committed(&mut client, &[ordered("k", 0)?, ordered("k", 1)?]).await?;
    delete_by_hand(&client, "k-0").await?;
    assert_eq!(deliver_events(&db, sweeping(), 1).await?, ["k-1"]);
    Ok(())
}

/// A request in a scope with deferred effects that enqueues `effects` effects under ordering
/// key `customer-7` (written at once, beside the key row): with [`Claim::complete`] and the
/// caller's commit, or with [`Claim::commit`].
async fn ordered_request(
    client: &mut Client,
    k: &str,
    effects: i32,
    one_round_trip: bool,
) -> TestResult {
    use txoutbox::Scope;
    use txoutbox_test_support::request::{charge_fingerprint, empty_created, key, new_claim};
    let scope = Scope::new("orders")?.with_deferred_effects();
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, &scope, &key(k), &charge_fingerprint(1)).await?;
    for n in 0..effects {
        claim.enqueue(
            &format!("event-{n}"),
            OutboxMessage::new("events", &serde_json::json!({ "request": k, "n": n }))?
                .with_ordering_key("customer-7"),
        )?;
    }
    let response = empty_created();
    if one_round_trip {
        claim.commit(tx, &response).await?;
    } else {
        claim.complete(&tx, &response).await?;
        tx.commit().await?;
    }
    Ok(())
}

#[tokio::test]
async fn ordered_effects_of_requests_wait_behind_the_row_ahead_of_their_key() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    ordered_request(&mut client, "first", 2, false).await?;
    ordered_request(&mut client, "second", 1, true).await?;
    ordered_request(&mut client, "third", 1, false).await?;
    let due: i64 = value(
        &client,
        "SELECT count(*) FROM txoutbox_messages \
         WHERE status = 'pending' AND next_attempt_at <= now()",
    )
    .await?;
    assert_eq!(due, 1, "only the first row of the key is due");

    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("events", sink.clone()).build()?);
    assert_eq!(sink.wait_for(4, Duration::from_secs(20)).await, 4);
    relay.stop().await?;
    let order: Vec<(String, i64)> = sink
        .deliveries()
        .iter()
        .map(|d| {
            (
                d.payload["request"].as_str().unwrap_or_default().to_owned(),
                d.payload["n"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    let expected: Vec<(String, i64)> = [("first", 0), ("first", 1), ("second", 0), ("third", 0)]
        .iter()
        .map(|(r, n)| ((*r).to_owned(), *n))
        .collect();
    assert_eq!(order, expected);
    Ok(())
}

#[tokio::test]
async fn a_delivered_row_replayed_behind_a_dead_row_of_its_key_waits_behind_it() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    enqueue_committed(&mut client, &[ordered("a", 0)?, ordered("a", 1)?]).await?;
    let sink = FailsKey::new("a-1");
    let relay = RunningRelay::start(db.relay()?.sink("events", sink.clone()).build()?);
    assert_eq!(sink.delivered.wait_for(1, Duration::from_secs(20)).await, 1);
    wait_until(&client, |c| c.failed >= 1).await?;
    relay.stop().await?;
    // a-0, delivered, is replayed: it queues behind a-1, dead.
    let delivered: uuid::Uuid = value(
        &client,
        "SELECT id FROM txoutbox_delivered WHERE downstream_key = 'a-0'",
    )
    .await?;
    let options = ReplayOptions {
        include_delivered: true,
        ..ReplayOptions::default()
    };
    admin::replay(
        &mut client,
        &ReplaySelection::Ids(vec![delivered]),
        &options,
        None,
    )
    .await?;
    assert_eq!(status(&client, "a-0").await?, Some(MessageStatus::Pending));
    assert!(due(&client).await?.is_empty(), "a-0 waits behind a-1");
    Ok(())
}
