//! One request of each sqlx [`Mode`]: the same work as the tokio-postgres modes beside them,
//! on a sqlx connection (prepared statements from sqlx's per-connection cache; no pipelining, so
//! the key's lock and lookup and `Claim::commit` take a round trip more each).

use anyhow::Result;
use sqlx::Connection;
use txoutbox::{Begin, Scope};

use super::requests::{effects, fresh_key, order_fingerprint, order_response, INSERT_ORDER};
use super::Mode;

/// One request of the sqlx `mode`, for one order (customer, amount).
pub(super) async fn one_request(
    conn: &mut sqlx::PgConnection,
    scope: &Scope,
    mode: Mode,
    (customer, amount): (String, i64),
) -> Result<()> {
    let mut tx = conn.begin().await?;
    if mode == Mode::SqlxBusiness {
        sqlx::query(INSERT_ORDER)
            .bind(&customer)
            .bind(amount)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        return Ok(());
    }
    let key = fresh_key()?;
    let fingerprint = order_fingerprint(&customer, amount);
    let Begin::New(mut claim) = txoutbox::begin(&mut tx, scope, &key, &fingerprint).await? else {
        anyhow::bail!("a fresh key was not new");
    };
    let id: i64 = sqlx::query_scalar(INSERT_ORDER)
        .bind(&customer)
        .bind(amount)
        .fetch_one(&mut *tx)
        .await?;
    for (effect, message) in effects(id, amount, &customer)? {
        claim.enqueue(effect, message)?;
    }
    let response = order_response(id);
    if matches!(mode, Mode::SqlxFullCommit | Mode::SqlxFullOneRow) {
        claim.commit(tx, &response).await?;
        return Ok(());
    }
    claim.complete(&mut tx, &response).await?;
    tx.commit().await?;
    Ok(())
}
