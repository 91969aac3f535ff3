//! `txoutbox::migrate_sqlx`: the same migrations, history and lock as `txoutbox::migrate`, so a
//! sqlx service and the `txoutbox migrate` command share one schema history.

use txoutbox::{check_schema, migrate, migrate_sqlx, Error};
use txoutbox_conformance::{drivers::Sqlx, Driver};
use txoutbox_test_support::{drop_schema, record_newer_migration, test_db, test_db_with_client};

/// Every migration this build carries, in order.
fn every_version() -> Vec<i32> {
    txoutbox::admin::embedded_migrations()
        .into_iter()
        .map(|(version, _, _)| version)
        .collect()
}

#[tokio::test]
async fn migrate_sqlx_applies_every_migration_into_the_history_migrate_reads() -> anyhow::Result<()>
{
    let (db, mut client) = test_db_with_client().await?;
    drop_schema(&client).await?;
    let mut conn = Sqlx::connect(db.info()).await?;
    assert_eq!(migrate_sqlx(&mut conn).await?, every_version());
    // The history is refinery's, checksums included: the tokio-postgres runner finds nothing to
    // do (a divergent checksum would make it fail).
    assert!(migrate(&mut client).await?.is_empty());
    check_schema(&client).await?;
    assert!(migrate_sqlx(&mut conn).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn two_sqlx_services_starting_at_once_apply_each_migration_once() -> anyhow::Result<()> {
    let db = test_db().await?;
    drop_schema(&db.connect().await?).await?;
    let (mut a, mut b) = (
        Sqlx::connect(db.info()).await?,
        Sqlx::connect(db.info()).await?,
    );
    let (a, b) = tokio::join!(migrate_sqlx(&mut a), migrate_sqlx(&mut b));
    let mut applied = [a?, b?].concat();
    applied.sort_unstable();
    assert_eq!(applied, every_version());
    check_schema(&db.connect().await?).await?;
    Ok(())
}

#[tokio::test]
async fn migrate_sqlx_refuses_a_schema_a_newer_txoutbox_migrated() -> anyhow::Result<()> {
    let (db, client) = test_db_with_client().await?;
    let newer = record_newer_migration(&client).await?;
    let mut conn = Sqlx::connect(db.info()).await?;
    let refused = migrate_sqlx(&mut conn).await.expect_err("a newer schema");
    assert!(matches!(refused, Error::Schema(_)), "{refused:?}");
    assert!(
        refused.to_string().contains(&newer.to_string()),
        "{refused}"
    );
    Ok(())
}
