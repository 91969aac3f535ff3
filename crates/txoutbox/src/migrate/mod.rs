//! Applies the numbered SQL files of `migrations/` (embedded at build time) with refinery, under a
//! Postgres advisory lock so that processes starting at once apply them once.

use tokio_postgres::Client;

use crate::error::{Error, Result};
use crate::schema::SchemaMismatch;
use crate::store::{schema, Unnamed};

#[cfg(feature = "sqlx")]
mod on_sqlx;
#[cfg(feature = "sqlx")]
pub use on_sqlx::migrate_sqlx;

mod embedded {
    // `migrations` here is a symbolic link to the workspace's top-level `migrations/`, the one
    // place the schema is written: `cargo package` copies the files it points to into the crate.
    refinery::embed_migrations!("migrations");
}

/// The table refinery records applied migrations in.
pub const HISTORY_TABLE: &str = "txoutbox_schema_history";

/// The advisory lock key migrations run under ("txoutbox" in ASCII, truncated to 8 bytes).
const MIGRATION_LOCK: i64 = 0x7478_6f75_7462_6f78;

/// Applies every migration not yet applied. Applying twice is a no-op. Returns the versions that
/// this call applied. A database a newer txoutbox migrated is refused with
/// [`Error::Schema`](crate::Error::Schema) ([`SchemaMismatch::Ahead`]), changing nothing.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>> {
    run(client, refinery::Target::Latest).await
}

/// Applies the migrations not yet applied up to `version` and no further: a staged upgrade (and
/// the upgrade tests, which fill a schema of an older version first). Returns the versions that
/// this call applied.
pub async fn migrate_to(client: &mut Client, version: i32) -> Result<Vec<i32>> {
    run(client, refinery::Target::Version(version)).await
}

async fn run(client: &mut Client, target: refinery::Target) -> Result<Vec<i32>> {
    schema::lock(&Unnamed(&*client), MIGRATION_LOCK).await?;
    let applied = apply(client, target).await;
    // Unlock whatever happened; a failed unlock only matters if the session lives on.
    let unlocked = schema::unlock(&Unnamed(&*client), MIGRATION_LOCK).await;
    let applied = applied?;
    unlocked?;
    Ok(applied)
}

/// Applies the migrations up to `target`. A schema a newer txoutbox migrated is refused in its
/// own words (a schema is never migrated down), before refinery finds its versions "missing".
async fn apply(client: &mut Client, target: refinery::Target) -> Result<Vec<i32>> {
    let version = crate::schema::schema_version(client).await?;
    if let Err(mismatch @ SchemaMismatch::Ahead { .. }) = version.check() {
        return Err(mismatch.into());
    }
    run_embedded(client, target).await
}

/// Runs refinery's runner of the embedded migrations up to `target` on `conn`, recording them
/// in [`HISTORY_TABLE`]: the versions it applied. Either driver's migrate ends here.
async fn run_embedded<C>(conn: &mut C, target: refinery::Target) -> Result<Vec<i32>>
where
    C: refinery::AsyncMigrate + Send,
{
    let report = embedded::migrations::runner()
        .set_target(target)
        .set_migration_table_name(HISTORY_TABLE)
        .run_async(conn)
        .await
        .map_err(|e| Error::Migration {
            message: e.to_string(),
            source: Some(Box::new(e)),
        })?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| m.version())
        .collect())
}

/// The migrations this build carries, as (version, name, checksum of the SQL), in order.
pub fn embedded_migrations() -> Vec<(i32, String, u64)> {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| (m.version(), m.name().to_owned(), m.checksum()))
        .collect()
}
