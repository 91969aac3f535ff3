//! `Claim::commit` given what it must refuse, a savepoint: what a refused or failed commit leaves
//! of the caller's transactions and connection, with tokio-postgres and deadpool transactions.
//! The COMMIT is sent behind the statement in one round trip, so a failed statement makes it a
//! rollback of the whole transaction on the server; no later statement may then run as if the
//! enclosing transaction were still open.

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Transaction};
use txoutbox::{Claim, Error, IdempotencyKey, OutboxMessage, Scope, StoredResponse};
use txoutbox_test_support::count;
use txoutbox_test_support::request::{
    charge_fingerprint as fingerprint, db_with_orders, key, new_claim, store_key_without_the_lock,
};

type TestResult = anyhow::Result<()>;

fn created() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![],
        body: b"{}".to_vec(),
    }
}

const ORDERS: &str = "SELECT count(*) FROM orders";

/// The SQLSTATE of a statement's failure (`None` when it ran).
fn code<T>(result: Result<T, tokio_postgres::Error>) -> Option<SqlState> {
    result.err().and_then(|e| e.code().cloned())
}

/// The SQLSTATE of a business write the handler makes after an error in `outer` (`None` when
/// it was accepted).
async fn write_after_the_error(outer: &tokio_postgres::Transaction<'_>) -> Option<SqlState> {
    code(
        outer
            .execute(
                "INSERT INTO orders (note) VALUES ('outer-after-error')",
                &[],
            )
            .await,
    )
}

/// A savepoint of `outer`, and the request with key `k` (scope `charges`) claimed in it.
async fn claimed_in_a_savepoint<'a>(
    outer: &'a mut Transaction<'_>,
    k: &IdempotencyKey,
) -> anyhow::Result<(Transaction<'a>, Claim)> {
    let inner = outer.transaction().await?;
    let claim = new_claim(&inner, &Scope::new("charges")?, k, &fingerprint(1)).await?;
    Ok((inner, claim))
}

/// A request in a savepoint of `outer`, stored with `Claim::commit`: the error it is refused with.
async fn commit_in_a_savepoint(outer: &mut Transaction<'_>, k: &str) -> anyhow::Result<Error> {
    let (inner, mut claim) = claimed_in_a_savepoint(outer, &key(k)).await?;
    inner
        .execute("INSERT INTO orders (note) VALUES ('inner')", &[])
        .await?;
    claim.enqueue("receipt", OutboxMessage::new("email", &1)?)?;
    Ok(claim
        .commit(inner, &created())
        .await
        .expect_err("a COMMIT in a savepoint would end the outer transaction"))
}

/// The caller's transaction, after a business write of its own (`outer-before`).
async fn outer_after_a_write(client: &mut Client) -> anyhow::Result<Transaction<'_>> {
    let outer = client.transaction().await?;
    outer
        .execute("INSERT INTO orders (note) VALUES ('outer-before')", &[])
        .await?;
    Ok(outer)
}

#[tokio::test]
async fn a_commit_refused_in_a_savepoint_lets_no_later_write_of_the_outer_transaction_commit(
) -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let mut outer = outer_after_a_write(&mut client).await?;
    let err = commit_in_a_savepoint(&mut outer, "k-savepoint").await?;
    assert!(matches!(err, Error::Internal(_)), "{err:?}");
    assert!(err.to_string().contains("savepoint"), "{err}");

    assert_eq!(
        write_after_the_error(&outer).await,
        Some(SqlState::IN_FAILED_SQL_TRANSACTION)
    );
    outer.rollback().await?;
    for table in [ORDERS, "txoutbox_messages", "txoutbox_idempotency_keys"] {
        assert_eq!(count(&client, table).await?, 0, "{table}");
    }
    Ok(())
}

#[tokio::test]
async fn the_outer_transaction_commits_nothing_after_a_commit_refused_in_its_savepoint(
) -> TestResult {
    let (db, mut client) = db_with_orders().await?;
    let mut outer = outer_after_a_write(&mut client).await?;
    commit_in_a_savepoint(&mut outer, "k-savepoint-commit").await?;
    // A handler that goes on as if nothing happened: its write fails, its commit commits nothing.
    assert!(write_after_the_error(&outer).await.is_some());
    // PostgreSQL ends an aborted transaction with a rollback, whatever it is asked.
    outer.commit().await?;
    let observer = db.connect().await?;
    assert_eq!(count(&observer, ORDERS).await?, 0);
    assert_eq!(count(&observer, "txoutbox_idempotency_keys").await?, 0);
    // The connection is out of any transaction: what it writes now commits at once.
    client
        .execute("INSERT INTO orders (note) VALUES ('later')", &[])
        .await?;
    assert_eq!(count(&observer, ORDERS).await?, 1);
    Ok(())
}

#[tokio::test]
async fn any_failed_commit_in_a_savepoint_leaves_the_outer_transaction_aborted() -> TestResult {
    let (db, mut client) = db_with_orders().await?;
    let k = key("k-savepoint-conflict");
    let mut outer = outer_after_a_write(&mut client).await?;
    let (inner, claim) = claimed_in_a_savepoint(&mut outer, &k).await?;
    // A request of a txoutbox before V5 stores the key meanwhile, without the lock: the
    // statement fails before the savepoint is looked at.
    store_key_without_the_lock(&db.connect().await?, &k).await?;
    let err = claim.commit(inner, &created()).await.expect_err("taken");
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    let source = std::error::Error::source(&err).expect("the server's answer");
    let server = source
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(|e| e.as_db_error());
    assert!(server.is_some(), "{source:?}");

    assert_eq!(
        write_after_the_error(&outer).await,
        Some(SqlState::IN_FAILED_SQL_TRANSACTION)
    );
    drop(outer);
    assert_eq!(count(&client, ORDERS).await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_commit_refused_in_a_deadpool_savepoint_aborts_the_outer_and_pools_a_clean_connection(
) -> TestResult {
    let (db, observer) = db_with_orders().await?;
    let pool = db.pool(1)?;
    {
        let mut conn = pool.get().await?;
        let mut outer = conn.transaction().await?;
        outer
            .execute("INSERT INTO orders (note) VALUES ('outer-before')", &[])
            .await?;
        let inner = outer.transaction().await?;
        let mut claim = new_claim(
            &inner,
            &Scope::new("charges")?,
            &key("k-pooled-savepoint"),
            &fingerprint(1),
        )
        .await?;
        claim.enqueue("receipt", OutboxMessage::new("email", &1)?)?;
        let err = claim.commit(inner, &created()).await.expect_err("refused");
        assert!(err.to_string().contains("savepoint"), "{err}");
        assert_eq!(
            write_after_the_error(&outer).await,
            Some(SqlState::IN_FAILED_SQL_TRANSACTION)
        );
        outer.rollback().await?;
    }
    // The pool's one connection, back in the pool: out of any transaction.
    let conn = pool.get().await?;
    conn.execute("INSERT INTO orders (note) VALUES ('later')", &[])
        .await?;
    assert_eq!(count(&observer, ORDERS).await?, 1);
    assert_eq!(count(&observer, "txoutbox_idempotency_keys").await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_failed_commit_of_the_outermost_transaction_pools_a_clean_connection() -> TestResult {
    let (db, observer) = db_with_orders().await?;
    let pool = db.pool(1)?;
    let k = key("k-pooled-conflict");
    {
        let mut conn = pool.get().await?;
        let tx = conn.transaction().await?;
        let claim = new_claim(&tx, &Scope::new("charges")?, &k, &fingerprint(1)).await?;
        tx.execute("INSERT INTO orders (note) VALUES ('refused')", &[])
            .await?;
        observer
            .execute(
                "INSERT INTO txoutbox_idempotency_keys (scope, key, fingerprint, state, \
                     response_status, response_headers, response_body, expires_at) \
                 VALUES ('charges', $1, '\\x00', 'completed', 201, '[]', '', \
                     now() + interval '1 day')",
                &[&k.as_str()],
            )
            .await?;
        let err = claim.commit(tx, &created()).await.expect_err("taken");
        assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    }
    let conn = pool.get().await?;
    conn.execute("INSERT INTO orders (note) VALUES ('later')", &[])
        .await?;
    assert_eq!(count(&observer, ORDERS).await?, 1);
    Ok(())
}
