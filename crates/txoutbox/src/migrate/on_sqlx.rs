//! `migrate_sqlx`: the same migrations, history table and advisory lock as [`super::migrate`],
//! applied over a sqlx connection. refinery's own runner does the work (its checks of applied
//! versions and checksums, one transaction per migration with its history row), through
//! refinery's async traits implemented here for a sqlx connection.

use refinery_core::traits::r#async::{AsyncQuery, AsyncTransaction};
use refinery_core::{AsyncMigrate, Migration};
use sqlx::{Connection, PgConnection, Row};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::{run_embedded, HISTORY_TABLE, MIGRATION_LOCK};
use crate::error::Result;
use crate::schema::{SchemaMismatch, SchemaVersion};

/// Applies every migration not yet applied, over a sqlx connection (outside any transaction),
/// as [`crate::migrate`] does over tokio-postgres: the same SQL files, the same history table
/// (`txoutbox_schema_history`, so either function, and `txoutbox migrate`, sees what the other
/// applied), the same advisory lock (two processes starting at once apply each migration
/// once). Returns the versions this call applied; a database a newer txoutbox migrated is
/// refused with [`Error::Schema`](crate::Error::Schema), changing nothing.
///
/// ```no_run
/// # async fn start(pool: sqlx::PgPool) -> Result<(), txoutbox::Error> {
/// let mut conn = pool.acquire().await?;
/// txoutbox::migrate_sqlx(&mut conn).await?;
/// # Ok(())
/// # }
/// ```
pub async fn migrate_sqlx(conn: &mut PgConnection) -> Result<Vec<i32>> {
    sqlx::query(crate::store::statements::session::ADVISORY_LOCK.sql)
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await?;
    let applied = apply(conn).await;
    // Unlocked whatever happened; a failed unlock only matters if the session lives on.
    let unlocked = sqlx::query(crate::store::statements::session::ADVISORY_UNLOCK.sql)
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await;
    let applied = applied?;
    unlocked?;
    Ok(applied)
}

async fn apply(conn: &mut PgConnection) -> Result<Vec<i32>> {
    let current =
        match sqlx::query_scalar::<_, i32>(crate::store::statements::schema_history::VERSION.sql)
            .fetch_one(&mut *conn)
            .await
        {
            Ok(version) => version,
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => 0,
            Err(e) => return Err(e.into()),
        };
    if let Err(mismatch @ SchemaMismatch::Ahead { .. }) =
        SchemaVersion::with_current(current).check()
    {
        return Err(mismatch.into());
    }
    run_embedded(&mut Refinery(conn), refinery::Target::Latest).await
}

/// A sqlx connection as refinery's async runner drives it.
struct Refinery<'c>(&'c mut PgConnection);

impl AsyncTransaction for Refinery<'_> {
    type Error = sqlx::Error;

    /// Runs `queries` (a migration's SQL, then its history row) in one transaction, each with
    /// the simple query protocol (several statements in one text), as refinery does on
    /// tokio-postgres.
    async fn execute<'a, T: Iterator<Item = &'a str> + Send + 'a>(
        &'a mut self,
        queries: T,
    ) -> std::result::Result<usize, Self::Error> {
        let mut tx = self.0.begin().await?;
        let mut count = 0;
        for query in queries {
            sqlx::raw_sql(sqlx::AssertSqlSafe(query))
                .execute(&mut *tx)
                .await?;
            count += 1;
        }
        tx.commit().await?;
        Ok(count)
    }
}

impl AsyncQuery<Vec<Migration>> for Refinery<'_> {
    /// The history's rows (version, name, applied_on, checksum), as refinery stores them.
    async fn query<'a>(
        &'a mut self,
        query: &'a str,
    ) -> std::result::Result<Vec<Migration>, Self::Error> {
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(query))
            .fetch_all(&mut *self.0)
            .await?;
        let mut applied = Vec::with_capacity(rows.len());
        for row in rows {
            let applied_on: String = row.try_get(2)?;
            let checksum: String = row.try_get(3)?;
            let decode = |what: &str, e: &dyn std::fmt::Display| {
                sqlx::Error::Decode(format!("{HISTORY_TABLE}: {what}: {e}").into())
            };
            applied.push(Migration::applied(
                row.try_get(0)?,
                row.try_get(1)?,
                OffsetDateTime::parse(&applied_on, &Rfc3339)
                    .map_err(|e| decode("applied_on", &e))?,
                checksum.parse().map_err(|e| decode("checksum", &e))?,
            ));
        }
        Ok(applied)
    }
}

impl AsyncMigrate for Refinery<'_> {}
