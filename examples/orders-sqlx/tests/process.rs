//! The binary as a real process: migrated at start, killed after an order's commit and retried,
//! stopped by SIGTERM.

use std::time::Duration;

use serde_json::Value;
use txoutbox_test_support::{count, drop_schema, test_db, test_db_with_client};

mod common;

use common::ServiceProcess;
use txoutbox_test_support::select::value;

#[tokio::test(flavor = "multi_thread")]
async fn killed_after_commit_then_retried_replays_the_one_order() -> anyhow::Result<()> {
    let (db, client) = test_db_with_client().await?;
    let url = common::sqlx_url(db.info())?;
    let mut crashing =
        ServiceProcess::start(&[("DATABASE_URL", &url), ("CRASH_AT", "after_commit")]).await?;
    let key = common::key();
    let lost = crashing.orders.post(&key, &common::order()).await;
    assert!(lost.is_err(), "the process died before answering: {lost:?}");
    let status = crashing.wait_exit(Duration::from_secs(20)).await?;
    assert!(!status.success(), "aborted after the commit: {status}");
    // The commit happened: the order and its effects are there, the client does not know it.
    assert_eq!(count(&client, "orders").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 2);

    let restarted = ServiceProcess::start(&[("DATABASE_URL", &url)]).await?;
    let retry = restarted.orders.post(&key, &common::order()).await?;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let answer: Value = retry.json().await?;
    let stored: uuid::Uuid = value(&client, "SELECT id FROM orders").await?;
    assert_eq!(answer["order_id"], stored.to_string());
    assert_eq!(count(&client, "orders").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn both_schemas_are_applied_at_start_on_an_empty_database() -> anyhow::Result<()> {
    let (db, client) = test_db_with_client().await?;
    drop_schema(&client).await?;
    let url = common::sqlx_url(db.info())?;
    // Two instances starting at once: each migration applied once, under its lock.
    let env = [("DATABASE_URL", url.as_str())];
    let (a, b) = tokio::join!(ServiceProcess::start(&env), ServiceProcess::start(&env));
    let (a, _b) = (a?, b?);
    let txoutbox_versions = txoutbox::admin::embedded_migrations().len() as i64;
    assert_eq!(
        count(&client, "txoutbox_schema_history").await?,
        txoutbox_versions
    );
    assert_eq!(
        count(&client, "_sqlx_migrations").await?,
        orders_sqlx::MIGRATOR.iter().count() as i64
    );
    let created = a.orders.post(&common::key(), &common::order()).await?;
    assert_eq!(created.status(), 201);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_the_service_cleanly() -> anyhow::Result<()> {
    let db = test_db().await?;
    let url = common::sqlx_url(db.info())?;
    let mut service = ServiceProcess::start(&[("DATABASE_URL", &url)]).await?;
    assert_eq!(
        service
            .orders
            .post(&common::key(), &common::order())
            .await?
            .status(),
        201
    );
    let pid = service.id()?.to_string();
    let sent = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await?;
    assert!(sent.success());
    let status = service.wait_exit(Duration::from_secs(20)).await?;
    assert!(status.success(), "a clean exit: {status}");
    Ok(())
}
