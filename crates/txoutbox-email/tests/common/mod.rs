//! Shared arrangements of the email tests: enqueueing an email, short retry policies, waiting on
//! the outbox tables.

#![allow(dead_code)] // each test binary uses its own part

use std::time::Duration;

use tokio_postgres::Client;
use txoutbox::admin::MessageStatus;
use txoutbox::sink::Delivery;
use txoutbox_email::{Email, DESTINATION};
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::{receipt_of, test_db_with_client, wait_for_key, TestDb};

/// Long enough for a loaded CI machine, short enough to fail fast.
pub const LIMIT: Duration = Duration::from_secs(30);

/// The email every test sends unless it needs another.
pub fn receipt() -> Email {
    Email::new("Shop <shop@example.com>", "ada@example.org", "Your receipt").text("Thanks, Ada.")
}

/// The first attempt of a [`receipt`] row with downstream key `key`, for calling a sink directly.
pub fn delivery(key: &str) -> anyhow::Result<Delivery> {
    Ok(Delivery {
        id: uuid::Uuid::now_v7(),
        destination: DESTINATION.to_owned(),
        payload: serde_json::to_value(receipt())?,
        headers: Default::default(),
        downstream_key: key.to_owned(),
        ordering_key: None,
        attempt: 1,
        created_at: chrono::Utc::now(),
    })
}

/// A test database holding one pending [`receipt`] with downstream key `key`, and a connection.
pub async fn db_with_receipt(key: &str) -> anyhow::Result<(TestDb, Client)> {
    let (db, mut client) = test_db_with_client().await?;
    enqueue(&mut client, &receipt(), key).await?;
    Ok((db, client))
}

/// Enqueues `email` with downstream key `key` in a transaction of its own.
pub async fn enqueue(client: &mut Client, email: &Email, key: &str) -> anyhow::Result<()> {
    let message = email
        .clone()
        .into_outbox_message()?
        .with_downstream_key(key);
    enqueue_committed(client, &[message]).await?;
    Ok(())
}

/// Waits until the row with downstream key `key` was delivered; returns its receipt.
pub async fn delivered_receipt(client: &Client, key: &str) -> anyhow::Result<Option<String>> {
    wait_for_key(client, key, MessageStatus::Delivered).await?;
    receipt_of(client, key).await
}

/// The attempt log of the row with downstream key `key`: (attempt, outcome, error), in order.
pub async fn attempts(
    client: &Client,
    key: &str,
) -> anyhow::Result<Vec<(i32, String, Option<String>)>> {
    Ok(client
        .query(
            "SELECT attempt, outcome, error FROM txoutbox_attempts WHERE downstream_key = $1 \
             ORDER BY started_at, attempt",
            &[&key],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}
