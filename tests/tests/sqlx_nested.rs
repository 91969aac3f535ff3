//! What only sqlx can promise: it knows its transactions' depth, so `Claim::commit` refuses a
//! nested transaction before sending anything, and the enclosing transaction goes on as it was
//! (tokio-postgres learns of a savepoint only from the statement sent with the COMMIT, which
//! then rolls back everything: see crates/txoutbox/tests/commit.rs).

use sqlx::Connection;
use txoutbox::{Begin, Error};
use txoutbox_conformance::{drivers::Sqlx, Driver, Request};
use txoutbox_test_support::count;
use txoutbox_test_support::request::db_with_orders;
use txoutbox_test_support::select::column;

#[tokio::test]
async fn claim_commit_refuses_a_nested_sqlx_transaction_before_sending_anything(
) -> anyhow::Result<()> {
    let (db, client) = db_with_orders().await?;
    let mut conn = Sqlx::connect(db.info()).await?;
    let mut outer = conn.begin().await?;
    sqlx::query("INSERT INTO orders (note) VALUES ('outer-before')")
        .execute(&mut *outer)
        .await?;
    let request = Request::new(txoutbox::Scope::new("charges")?, "k-nested", 1)?;
    {
        let mut inner = outer.begin().await?;
        let Begin::New(claim) = txoutbox::begin(
            &mut inner,
            &request.scope,
            &request.key,
            &request.fingerprint,
        )
        .await?
        else {
            anyhow::bail!("a new key was expected");
        };
        sqlx::query("INSERT INTO orders (note) VALUES ('inner')")
            .execute(&mut *inner)
            .await?;
        let refused = claim
            .commit(inner, &request.response())
            .await
            .expect_err("a COMMIT in a savepoint would end the outer transaction");
        assert!(matches!(refused, Error::Internal(_)), "{refused:?}");
        assert!(
            refused.to_string().contains("before anything was sent"),
            "{refused}"
        );
    }
    // The outer transaction goes on: the savepoint alone was rolled back.
    sqlx::query("INSERT INTO orders (note) VALUES ('outer-after')")
        .execute(&mut *outer)
        .await?;
    outer.commit().await?;
    let notes: Vec<String> = column(&client, "SELECT note FROM orders ORDER BY id").await?;
    assert_eq!(notes, ["outer-before", "outer-after"]);
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 0);
    assert_eq!(count(&client, "txoutbox_messages").await?, 0);
    Ok(())
}
