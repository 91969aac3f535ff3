//! A row of either driver read by column index, so that each row of the write path is decoded
//! by one function for every driver ([`super::driver::LockRow`], [`super::driver::FoundRow`],
//! [`super::inbox::FoundRecord`], [`super::messages::Inserted`]).

use tokio_postgres::types::FromSql;

/// A driver's row, and the error it answers a column it cannot decode with.
pub(crate) trait DriverRow {
    /// The driver's error.
    type Error;
}

/// A row whose columns decode as `T`.
pub(crate) trait Column<T>: DriverRow {
    /// Column `index` of the row.
    fn column(&self, index: usize) -> Result<T, Self::Error>;
}

impl DriverRow for tokio_postgres::Row {
    type Error = tokio_postgres::Error;
}

impl<T: for<'a> FromSql<'a>> Column<T> for tokio_postgres::Row {
    fn column(&self, index: usize) -> Result<T, Self::Error> {
        self.try_get(index)
    }
}

#[cfg(feature = "sqlx")]
impl DriverRow for sqlx::postgres::PgRow {
    type Error = sqlx::Error;
}

#[cfg(feature = "sqlx")]
impl<T> Column<T> for sqlx::postgres::PgRow
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    fn column(&self, index: usize) -> Result<T, Self::Error> {
        sqlx::Row::try_get(self, index)
    }
}
