//! The schema version check: a database never migrated, one missing its last migration and one a
//! newer txoutbox migrated are told apart from the one this build needs, in one line that says
//! what to run; `migrate` never goes down; the embedded relay refuses to start on a schema it
//! cannot use and waits for a database that does not answer yet.

use std::time::Duration;

use txoutbox::relay::Relay;
use txoutbox::{Error, SchemaMismatch, SchemaVersion};
use txoutbox_test_support::factory::pending;
use txoutbox_test_support::relay::{relay_config, RecordingSink, RunningRelay};
use txoutbox_test_support::{
    count, drop_schema, forget_last_migration, latest_migration, record_newer_migration,
    test_db_with_client, Cluster, TestDb,
};

type TestResult = anyhow::Result<()>;

/// The mismatch `check_schema` reports on `client`'s database (`None`: it matches).
async fn mismatch(client: &tokio_postgres::Client) -> anyhow::Result<Option<SchemaMismatch>> {
    match txoutbox::check_schema(client).await {
        Ok(_) => Ok(None),
        Err(Error::Schema(mismatch)) => Ok(Some(mismatch)),
        Err(other) => Err(other.into()),
    }
}

/// A relay with one sink, on `db`.
fn relay_on(db: &TestDb, sink: &RecordingSink) -> anyhow::Result<Relay> {
    Ok(db
        .relay()?
        .config(relay_config())
        .sink("email", sink.clone())
        .build()?)
}

/// Runs a relay over `db` that is never asked to stop, and returns what it returned by itself;
/// fails when it is still running after 20 s (it ran on `what`).
async fn run_until_it_returns(
    db: &TestDb,
    what: &str,
) -> anyhow::Result<txoutbox::Result<txoutbox::relay::RelayReport>> {
    let relay = relay_on(db, &RecordingSink::new())?;
    let run = relay.run(std::future::pending::<()>());
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .map_err(|_| anyhow::anyhow!("the relay ran on {what}"))
}

#[tokio::test]
async fn a_migrated_database_is_at_the_version_this_build_needs() -> TestResult {
    let (_db, client) = test_db_with_client().await?;
    let version = txoutbox::check_schema(&client).await?;
    assert_eq!(
        version,
        SchemaVersion {
            current: latest_migration(),
            required: latest_migration()
        }
    );
    Ok(())
}

#[tokio::test]
async fn a_database_never_migrated_is_at_version_0_and_told_to_migrate() -> TestResult {
    let (_db, client) = test_db_with_client().await?;
    drop_schema(&client).await?;
    let found = mismatch(&client).await?;
    assert_eq!(
        found,
        Some(SchemaMismatch::Behind {
            current: 0,
            required: latest_migration()
        })
    );
    assert_eq!(
        found.map(|m| m.to_string()),
        Some(format!(
            "the database schema is at version 0, this txoutbox needs {}: run `txoutbox migrate`",
            latest_migration()
        ))
    );
    Ok(())
}

#[tokio::test]
async fn a_database_missing_its_last_migration_is_behind() -> TestResult {
    let (_db, client) = test_db_with_client().await?;
    let current = forget_last_migration(&client).await?;
    assert_eq!(
        mismatch(&client).await?,
        Some(SchemaMismatch::Behind {
            current,
            required: latest_migration()
        })
    );
    Ok(())
}

#[tokio::test]
async fn a_database_a_newer_txoutbox_migrated_is_ahead_and_told_to_upgrade() -> TestResult {
    let (_db, client) = test_db_with_client().await?;
    let newer = record_newer_migration(&client).await?;
    let found = mismatch(&client).await?;
    assert_eq!(
        found,
        Some(SchemaMismatch::Ahead {
            current: newer,
            required: latest_migration()
        })
    );
    assert_eq!(
        found.map(|m| m.to_string()),
        Some(format!(
            "the database schema is at version {newer}, this txoutbox knows only up to {}: \
             upgrade txoutbox (a schema is never migrated down)",
            latest_migration()
        ))
    );
    Ok(())
}

#[tokio::test]
async fn migrate_refuses_a_schema_a_newer_txoutbox_migrated_and_changes_nothing() -> TestResult {
    let (_db, mut client) = test_db_with_client().await?;
    let newer = record_newer_migration(&client).await?;
    let refused = txoutbox::migrate(&mut client).await;
    assert!(
        matches!(
            refused,
            Err(Error::Schema(SchemaMismatch::Ahead { current, .. })) if current == newer
        ),
        "{refused:?}"
    );
    let history = count(&client, "txoutbox_schema_history").await?;
    assert_eq!(
        history,
        txoutbox::admin::embedded_migrations().len() as i64 + 1,
        "the history is untouched"
    );
    Ok(())
}

/// Runs a relay over `db` (a database `what`) that is never asked to stop: it must return by
/// itself, refusing to start with the schema mismatch `expected`.
async fn refuses_to_start(db: &TestDb, what: &str, expected: SchemaMismatch) -> TestResult {
    let result = run_until_it_returns(db, what).await?;
    assert!(
        matches!(&result, Err(Error::Schema(found)) if *found == expected),
        "{result:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_embedded_relay_refuses_to_start_on_a_database_never_migrated() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    drop_schema(&client).await?;
    let never = SchemaMismatch::Behind {
        current: 0,
        required: latest_migration(),
    };
    refuses_to_start(&db, "a database never migrated", never).await
}

#[tokio::test]
async fn an_embedded_relay_refuses_to_start_on_a_schema_a_newer_txoutbox_migrated() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let newer = SchemaMismatch::Ahead {
        current: record_newer_migration(&client).await?,
        required: latest_migration(),
    };
    refuses_to_start(&db, "a schema newer than this build", newer).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_relay_started_while_postgres_is_down_waits_and_then_delivers() -> TestResult {
    let (cluster, db) = Cluster::private_with_db().await?;
    pending(&db, "email", "waited-1").await?;
    cluster.stop()?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(relay_on(&db, &sink)?);
    let _cluster = tokio::task::spawn_blocking(move || cluster.start().map(|()| cluster)).await??;
    assert_eq!(sink.wait_for(1, Duration::from_secs(30)).await, 1);
    assert_eq!(sink.keys(), ["waited-1"]);
    relay.stop().await?;
    Ok(())
}

#[tokio::test]
async fn an_admin_call_on_a_database_never_migrated_says_to_migrate() -> TestResult {
    let (_db, client) = test_db_with_client().await?;
    drop_schema(&client).await?;
    let err = txoutbox::admin::stats(&client)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("(42P01)"), "{err}");
    assert!(err.contains("run `txoutbox migrate`"), "{err}");
    Ok(())
}
