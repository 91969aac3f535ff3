//! The write path's wake-up hint (`RelayWaker`) against a real Postgres: it goes out on a
//! connection of its own, whatever the business pool is doing, and survives the server dropping
//! that connection.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::AsyncMessage;
use txoutbox::relay::RelayWaker;
use txoutbox_test_support::{test_db, TestDb};

type TestResult = anyhow::Result<()>;

/// A connection LISTENing on the wake-up channel; each hint arrives on the receiver.
async fn hints(db: &TestDb) -> anyhow::Result<(tokio_postgres::Client, UnboundedReceiver<()>)> {
    let (listener, mut connection) = db.config()?.connect().await?;
    let (sender, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                if n.channel() == txoutbox::relay::WAKE_CHANNEL {
                    let _ = sender.send(());
                }
            }
        }
    });
    listener
        .batch_execute(&format!("LISTEN {}", txoutbox::relay::WAKE_CHANNEL))
        .await?;
    Ok((listener, received))
}

async fn next_hint(hints: &mut UnboundedReceiver<()>) -> TestResult {
    tokio::time::timeout(Duration::from_secs(10), hints.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the listener is gone"))
}

/// A listener, and a waker over a business pool of one connection with that connection held:
/// the pool cannot send a hint, only a connection of the waker's own can.
struct HeldPool {
    listener: tokio_postgres::Client,
    received: UnboundedReceiver<()>,
    waker: RelayWaker,
    _held: deadpool_postgres::Object,
}

/// A [`HeldPool`] whose waker has sent one hint, received.
async fn hinted_beside_a_held_pool(db: &TestDb) -> anyhow::Result<HeldPool> {
    let (listener, mut received) = hints(db).await?;
    let pool = db.pool(1)?;
    let held = pool.get().await?;
    let waker = RelayWaker::spawn(pool);
    waker.wake();
    next_hint(&mut received).await?;
    Ok(HeldPool {
        listener,
        received,
        waker,
        _held: held,
    })
}

#[tokio::test]
async fn a_hint_goes_out_while_every_business_connection_is_held() -> TestResult {
    let db = test_db().await?;
    hinted_beside_a_held_pool(&db).await?;
    Ok(())
}

#[tokio::test]
async fn the_hint_connection_is_opened_again_after_the_server_drops_it() -> TestResult {
    let db = test_db().await?;
    // The pool cannot stand in: only a new connection of the waker's own can send the hint.
    let mut held = hinted_beside_a_held_pool(&db).await?;
    let dropped: i64 = held
        .listener
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND query LIKE '%pg_notify%'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(dropped, 1, "the waker's connection was found and dropped");
    held.waker.wake();
    next_hint(&mut held.received).await
}
