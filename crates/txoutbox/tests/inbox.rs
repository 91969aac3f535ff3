//! The inbox (`txoutbox::inbox`): each received message applied once in the receiving
//! transaction, against a real Postgres.

use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio_postgres::{Client, Transaction};
use txoutbox::inbox::{self, derive_inbox_downstream_key, Consumer, InboxClaim, Outcome, Receive};
use txoutbox::{Error, OutboxMessage};
use txoutbox_test_support::select::value;
use txoutbox_test_support::{
    assert_keys_derived_from_the_inbox, count, test_db_with_sql, wait_for_exact_count, TestDb,
};

type TestResult = anyhow::Result<()>;

async fn db_with_shipments() -> anyhow::Result<(TestDb, Client)> {
    let (db, client) = test_db_with_sql(
        "CREATE TABLE shipments (id bigserial PRIMARY KEY, charge_id text NOT NULL)",
    )
    .await?;
    Ok((db, client))
}

fn shipping() -> Consumer {
    Consumer::new("shipping").expect("valid consumer")
}

/// A test database with the `shipments` table, a client on it, and the `shipping` consumer.
async fn shipping_db() -> anyhow::Result<(TestDb, Client, Consumer)> {
    let (db, client) = db_with_shipments().await?;
    Ok((db, client, shipping()))
}

/// The handler's writes for the new message `id`: one shipment and one onward email.
async fn ship(tx: &Transaction<'_>, mut claim: InboxClaim, id: &str) -> anyhow::Result<()> {
    tx.execute("INSERT INTO shipments (charge_id) VALUES ($1)", &[&id])
        .await?;
    claim.enqueue(
        "ships-email",
        OutboxMessage::new("email", &serde_json::json!({"charge": id}))?,
    )?;
    claim.complete(tx).await?;
    Ok(())
}

/// The handler: [`ship`] and commit, in one transaction. Returns whether it ran.
async fn deliver(client: &mut Client, consumer: &Consumer, id: &str) -> anyhow::Result<bool> {
    let tx = client.transaction().await?;
    match inbox::receive(&tx, consumer, id).await? {
        Receive::New(claim) => {
            ship(&tx, claim, id).await?;
            tx.commit().await?;
            Ok(true)
        }
        Receive::Duplicate { .. } => Ok(false),
    }
}

/// The first delivery of `msg_1`, received in `tx` and not yet applied.
async fn first_delivery(tx: &Transaction<'_>, consumer: &Consumer) -> anyhow::Result<InboxClaim> {
    let Receive::New(claim) = inbox::receive(tx, consumer, "msg_1").await? else {
        anyhow::bail!("first delivery not new");
    };
    Ok(claim)
}

#[tokio::test]
async fn a_redelivered_message_is_a_duplicate_and_runs_once() -> TestResult {
    let (_db, mut client, consumer) = shipping_db().await?;
    let mut ran = 0;
    for _ in 0..5 {
        ran += u32::from(deliver(&mut client, &consumer, "msg_1").await?);
    }
    assert_eq!(ran, 1);
    assert_eq!(count(&client, "shipments").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 1);

    let tx = client.transaction().await?;
    let received: chrono::DateTime<chrono::Utc> =
        value(&tx, "SELECT received_at FROM txoutbox_inbox").await?;
    match inbox::receive(&tx, &consumer, "msg_1").await? {
        Receive::Duplicate {
            first_received,
            outcome,
        } => {
            assert_eq!(first_received, received);
            assert_eq!(outcome, Outcome::Processed);
        }
        Receive::New(_) => anyhow::bail!("a received message was new again"),
    }
    Ok(())
}

#[tokio::test]
async fn a_rolled_back_handler_leaves_no_record_and_the_redelivery_runs() -> TestResult {
    let (_db, mut client, consumer) = shipping_db().await?;
    {
        let tx = client.transaction().await?;
        let _claim = first_delivery(&tx, &consumer).await?;
        tx.execute("INSERT INTO shipments (charge_id) VALUES ('x')", &[])
            .await?;
        tx.rollback().await?;
    }
    assert_eq!(count(&client, "txoutbox_inbox").await?, 0);
    assert!(deliver(&mut client, &consumer, "msg_1").await?);
    assert_eq!(count(&client, "shipments").await?, 1);
    Ok(())
}

#[tokio::test]
async fn consumers_have_their_own_id_spaces() -> TestResult {
    let (_db, mut client) = db_with_shipments().await?;
    assert!(deliver(&mut client, &shipping(), "msg_1").await?);
    assert!(deliver(&mut client, &Consumer::new("billing")?, "msg_1").await?);
    assert!(!deliver(&mut client, &shipping(), "msg_1").await?);
    Ok(())
}

#[tokio::test]
async fn fifty_concurrent_deliveries_of_one_message_make_one_effect() -> TestResult {
    let (db, client) = db_with_shipments().await?;
    let consumer = Arc::new(shipping().with_lock_timeout(Duration::from_secs(30))?);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let mut c = db.connect().await?;
        let consumer = consumer.clone();
        tasks.push(tokio::spawn(async move {
            deliver(&mut c, &consumer, "msg_race").await
        }));
    }
    let mut ran = 0;
    for task in tasks {
        ran += u32::from(task.await??);
    }
    assert_eq!(
        ran, 1,
        "one delivery ran the handler, the others were duplicates"
    );
    assert_eq!(count(&client, "shipments").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 1);
    Ok(())
}

/// The number of backends waiting on a lock.
const WAITING: &str = "SELECT count(*) FROM pg_stat_activity \
     WHERE wait_event_type = 'Lock' AND datname = current_database()";

/// Starts a second delivery of `msg_1`, on a connection of its own, and returns once it waits
/// on the lock of the first delivery's record.
async fn race_a_second_delivery(
    db: &TestDb,
    watcher: &Client,
    consumer: &Consumer,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<bool>>> {
    let mut second = db.connect().await?;
    let consumer = consumer.clone();
    let racing = tokio::spawn(async move { deliver(&mut second, &consumer, "msg_1").await });
    wait_for_exact_count(watcher, WAITING, 1, Duration::from_secs(10)).await?;
    Ok(racing)
}

/// A redelivery racing the first attempt waits for its end: a duplicate once the first commits,
/// run once the first rolls back. One shipment either way.
#[tokio::test]
async fn a_redelivery_racing_the_first_waits_for_it_then_is_a_duplicate_or_runs() -> TestResult {
    for first_commits in [true, false] {
        let case = if first_commits {
            "the first commits"
        } else {
            "the first rolls back"
        };
        let (db, mut first, consumer) = shipping_db().await?;
        let watcher = db.connect().await?;
        let tx = first.transaction().await?;
        let claim = first_delivery(&tx, &consumer).await?;
        let racing = race_a_second_delivery(&db, &watcher, &consumer).await?;
        if first_commits {
            tx.execute("INSERT INTO shipments (charge_id) VALUES ('msg_1')", &[])
                .await?;
            claim.complete(&tx).await?;
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        assert_eq!(
            racing.await??,
            !first_commits,
            "{case}: the racing delivery runs the handler only after a rollback"
        );
        assert_eq!(count(&watcher, "shipments").await?, 1, "{case}");
    }
    Ok(())
}

#[tokio::test]
async fn a_redelivery_that_waits_past_the_lock_timeout_is_a_conflict() -> TestResult {
    let (db, mut first) = db_with_shipments().await?;
    let consumer = shipping().with_lock_timeout(Duration::from_millis(50))?;
    let tx = first.transaction().await?;
    let _claim = first_delivery(&tx, &consumer).await?;
    let mut second = db.connect().await?;
    let tx2 = second.transaction().await?;
    let answer = inbox::receive(&tx2, &consumer, "msg_1").await;
    assert!(
        matches!(&answer, Err(e @ Error::Conflict { .. }) if e.http_status() == 409),
        "{answer:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_callers_lock_timeout_is_restored_after_receive() -> TestResult {
    let (_db, mut client, consumer) = shipping_db().await?;
    assert!(deliver(&mut client, &consumer, "msg_1").await?);
    let tx = client.transaction().await?;
    tx.batch_execute("SET LOCAL lock_timeout = '7s'").await?;
    let Receive::New(_claim) = inbox::receive(&tx, &consumer, "msg_2").await? else {
        anyhow::bail!("new message not new");
    };
    let shown: String = value(&tx, "SHOW lock_timeout").await?;
    assert_eq!(shown, "7s", "after a new message");
    let Receive::Duplicate { .. } = inbox::receive(&tx, &consumer, "msg_1").await? else {
        anyhow::bail!("old message new again");
    };
    let shown: String = value(&tx, "SHOW lock_timeout").await?;
    assert_eq!(shown, "7s", "after a duplicate");
    Ok(())
}

#[tokio::test]
async fn a_record_committed_after_a_repeatable_read_snapshot_is_a_conflict() -> TestResult {
    let (db, mut client, consumer) = shipping_db().await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await?;
    tx.query_one("SELECT 1", &[]).await?; // takes the snapshot
    let mut other = db.connect().await?;
    assert!(deliver(&mut other, &consumer, "msg_1").await?);
    let answer = inbox::receive(&tx, &consumer, "msg_1").await;
    assert!(matches!(answer, Err(Error::Conflict { .. })), "{answer:?}");
    Ok(())
}

#[tokio::test]
async fn the_deadpool_driver_receives_in_the_callers_transaction() -> TestResult {
    let (db, client) = db_with_shipments().await?;
    let pool = db.pool(2)?;
    let consumer = shipping();
    for expect_new in [true, false] {
        let mut conn = pool.get().await?;
        let tx = conn.transaction().await?;
        let answer = inbox::receive(&tx, &consumer, "msg_1").await?;
        assert_eq!(matches!(answer, Receive::New(_)), expect_new);
        if let Receive::New(claim) = answer {
            claim.complete(&tx).await?;
        }
        tx.commit().await?;
    }
    assert_eq!(count(&client, "txoutbox_inbox").await?, 1);
    Ok(())
}

#[tokio::test]
async fn onward_effects_carry_keys_derived_from_consumer_message_and_effect() -> TestResult {
    let (_db, mut client, consumer) = shipping_db().await?;
    assert!(deliver(&mut client, &consumer, "msg_1").await?);
    let key: String = value(&client, "SELECT downstream_key FROM txoutbox_messages").await?;
    assert_eq!(
        key,
        derive_inbox_downstream_key("shipping", "msg_1", "ships-email")
    );
    Ok(())
}

#[tokio::test]
async fn an_expired_record_is_pruned_and_the_message_is_new_again() -> TestResult {
    let (_db, mut client, consumer) = shipping_db().await?;
    for i in 0..5 {
        assert!(deliver(&mut client, &consumer, &format!("old_{i}")).await?);
    }
    assert!(deliver(&mut client, &consumer, "live").await?);
    client
        .execute(
            "UPDATE txoutbox_inbox SET expires_at = now() - interval '1 second' \
             WHERE message_id LIKE 'old_%'",
            &[],
        )
        .await?;
    // Expired but not pruned yet: new again already, the record taken over.
    assert!(deliver(&mut client, &consumer, "old_0").await?);
    client
        .execute(
            "UPDATE txoutbox_inbox SET expires_at = now() - interval '1 second' \
             WHERE message_id = 'old_0'",
            &[],
        )
        .await?;
    let stats = txoutbox::admin::stats(&client).await?;
    assert_eq!((stats.inbox.records, stats.inbox.expired), (6, 5));
    let report = txoutbox::admin::purge(
        &client,
        &txoutbox::admin::PurgeOptions {
            batch: 2,
            ..Default::default()
        },
        None,
    )
    .await?;
    assert_eq!(report.expired_inbox, 5);
    assert_eq!(
        count(&client, "txoutbox_inbox").await?,
        1,
        "the live one stays"
    );
    assert!(
        deliver(&mut client, &consumer, "old_3").await?,
        "pruned: new again"
    );
    assert!(!deliver(&mut client, &consumer, "live").await?);
    Ok(())
}

#[tokio::test]
async fn a_message_given_up_is_recorded_and_its_redelivery_is_a_duplicate() -> TestResult {
    let (_db, mut client, consumer) = shipping_db().await?;
    let tx = client.transaction().await?;
    assert!(inbox::record_failure(&tx, &consumer, "poison", "bad\0 payload").await?);
    tx.commit().await?;
    let tx = client.transaction().await?;
    let answer = inbox::receive(&tx, &consumer, "poison").await?;
    assert!(
        matches!(
            answer,
            Receive::Duplicate {
                outcome: Outcome::Failed,
                ..
            }
        ),
        "{answer:?}"
    );
    tx.rollback().await?;
    let found = txoutbox::admin::lookup_inbox(&client, "shipping", "poison", &[])
        .await?
        .expect("a record");
    assert_eq!(found.record.outcome, "failed");
    assert_eq!(found.record.error.as_deref(), Some("bad payload"));
    assert_eq!(txoutbox::admin::stats(&client).await?.inbox.failed, 1);
    Ok(())
}

#[tokio::test]
async fn the_lookup_finds_a_record_and_the_effects_its_handler_enqueued() -> TestResult {
    let (_db, mut client) = db_with_shipments().await?;
    assert!(deliver(&mut client, &shipping(), "msg_1").await?);
    let found =
        txoutbox::admin::lookup_inbox(&client, "shipping", "msg_1", &["ships-email".to_owned()])
            .await?
            .expect("a record");
    assert_eq!(found.record.outcome, "processed");
    assert_eq!(found.messages.len(), 1);
    assert!(
        txoutbox::admin::lookup_inbox(&client, "shipping", "msg_2", &[])
            .await?
            .is_none()
    );
    Ok(())
}

#[tokio::test]
async fn hostile_message_ids_are_refused_before_anything_is_written() -> TestResult {
    let (_db, mut client) = db_with_shipments().await?;
    let tx = client.transaction().await?;
    for id in ["", "a\0b", "line\nbreak"] {
        let answer = inbox::receive(&tx, &shipping(), id).await;
        assert!(
            matches!(answer, Err(Error::Invalid(_))),
            "{id:?}: {answer:?}"
        );
    }
    tx.commit().await?;
    assert_eq!(count(&client, "txoutbox_inbox").await?, 0);
    Ok(())
}

/// Many messages, each delivered one to four times, a delivery killed at random between its
/// handler's writes and its commit (the transaction dropped with its connection): every message
/// is applied once and its onward effect enqueued once, with the one key derived for it.
#[tokio::test]
async fn killed_and_repeated_deliveries_enqueue_each_onward_effect_once_with_one_key() -> TestResult
{
    let (db, client) = db_with_shipments().await?;
    let consumer = shipping();
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    for m in 0..100 {
        let id = format!("msg_{m}");
        let mut applied = false;
        for _ in 0..rng.random_range(1..=4) {
            let mut c = db.connect().await?;
            if rng.random_bool(0.3) {
                // Killed before its commit: the connection goes with the transaction.
                let tx = c.transaction().await?;
                if let Receive::New(claim) = inbox::receive(&tx, &consumer, &id).await? {
                    ship(&tx, claim, &id).await?;
                }
                drop(tx);
                drop(c);
                continue;
            }
            applied |= deliver(&mut c, &consumer, &id).await?;
        }
        if !applied {
            let mut c = db.connect().await?;
            deliver(&mut c, &consumer, &id).await?;
        }
    }
    assert_eq!(count(&client, "shipments").await?, 100);
    assert_eq!(
        count(&client, "SELECT count(DISTINCT charge_id) FROM shipments").await?,
        100
    );
    assert_keys_derived_from_the_inbox(&client, "charge", "shipping", "ships-email", 100).await?;
    Ok(())
}
