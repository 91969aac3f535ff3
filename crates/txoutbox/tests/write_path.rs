//! The write path against a real Postgres: keys, replays, atomicity, concurrency, bad input.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_postgres::{AsyncMessage, Client, IsolationLevel};
use txoutbox::{
    begin, enqueue, idempotency::KeyError, relay::RelayWaker, Begin, Error, Fingerprint,
    IdempotencyKey, OutboxMessage, Scope, StoredResponse,
};
use txoutbox_test_support::request::{empty_answer, empty_created};
use txoutbox_test_support::{count, keys_expired, test_db, test_db_with_client, Cluster};

type TestResult = anyhow::Result<()>;

use txoutbox_test_support::request::{
    at_once, charge_fingerprint as charge_fp, db_with_orders, key, new_claim,
    the_one_that_did_the_work,
};
use txoutbox_test_support::select::{column, value};

fn created(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-request".into(), "a".into()),
            ("x-request".into(), "b".into()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

/// The handler every test runs: one business row, two effects, a 201.
async fn charge(
    client: &mut Client,
    scope: &Scope,
    k: &IdempotencyKey,
    fp: &Fingerprint,
) -> Result<StoredResponse, Error> {
    charge_at(client, None, scope, k, fp).await
}

/// [`charge`] in a transaction of the given isolation level (the session's default for `None`).
async fn charge_at(
    client: &mut Client,
    isolation: Option<IsolationLevel>,
    scope: &Scope,
    k: &IdempotencyKey,
    fp: &Fingerprint,
) -> Result<StoredResponse, Error> {
    let mut builder = client.build_transaction();
    if let Some(level) = isolation {
        builder = builder.isolation_level(level);
    }
    let tx = builder.start().await?;
    match begin(&tx, scope, k, fp).await? {
        Begin::New(mut claim) => {
            let row = tx
                .query_one(
                    "INSERT INTO orders (note) VALUES ($1) RETURNING id",
                    &[&k.as_str()],
                )
                .await?;
            let id: i64 = row.get(0);
            claim.enqueue(
                "stripe",
                OutboxMessage::new("stripe", &serde_json::json!({"amount": 100, "order": id}))?,
            )?;
            claim.enqueue(
                "receipt",
                OutboxMessage::new("email", &serde_json::json!({"to": "a@example.com"}))?,
            )?;
            let response = created(&format!(r#"{{"order":{id}}}"#));
            claim.complete(&tx, &response).await?;
            tx.commit().await?;
            Ok(response)
        }
        Begin::Replay(stored) => Ok(stored),
        Begin::Mismatch => Ok(empty_answer(422)),
        Begin::InFlight => Ok(empty_answer(409)),
    }
}

#[tokio::test]
async fn retry_with_same_key_replays_stored_response() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let scope = Scope::new("charges")?;
    let k = key("3f8e2a90-0000-4000-8000-000000000001");
    let first = charge(&mut client, &scope, &k, &charge_fp(100)).await?;
    let second = charge(&mut client, &scope, &k, &charge_fp(100)).await?;
    assert_eq!(first.status, 201);
    assert_eq!(
        second, first,
        "status, headers (order, repeats) and body identical"
    );
    assert_eq!(count(&client, "orders").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 2);
    Ok(())
}

#[tokio::test]
async fn same_key_with_other_request_is_a_mismatch() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let scope = Scope::new("charges")?;
    let k = key("k-mismatch");
    charge(&mut client, &scope, &k, &charge_fp(100)).await?;
    let tx = client.transaction().await?;
    assert!(matches!(
        begin(&tx, &scope, &k, &charge_fp(999)).await?,
        Begin::Mismatch
    ));
    drop(tx);
    assert_eq!(count(&client, "orders").await?, 1);
    Ok(())
}

#[tokio::test]
async fn key_held_by_a_concurrent_request_is_in_flight_then_replayed() -> TestResult {
    let (db, mut first) = db_with_orders().await?;
    let mut second = db.connect().await?;
    let scope = Scope::new("charges")?.with_lock_timeout(Duration::from_millis(200))?;
    let k = key("k-inflight");
    let tx1 = first.transaction().await?;
    let claim = new_claim(&tx1, &scope, &k, &charge_fp(1)).await?;
    let tx2 = second.transaction().await?;
    assert!(matches!(
        begin(&tx2, &scope, &k, &charge_fp(1)).await?,
        Begin::InFlight
    ));
    drop(tx2);
    claim.complete(&tx1, &created("{}")).await?;
    tx1.commit().await?;
    let tx3 = second.transaction().await?;
    assert!(matches!(
        begin(&tx3, &scope, &k, &charge_fp(1)).await?,
        Begin::Replay(r) if r.status == 201
    ));
    Ok(())
}

#[tokio::test]
async fn the_callers_lock_timeout_is_restored_after_begin() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    client.batch_execute("SET lock_timeout = '7s'").await?;
    let tx = client.transaction().await?;
    let _ = begin(&tx, &Scope::new("s")?, &key("k"), &charge_fp(1)).await?;
    let timeout: String = value(&tx, "SHOW lock_timeout").await?;
    assert_eq!(timeout, "7s");
    Ok(())
}

#[tokio::test]
async fn error_before_commit_leaves_nothing_and_retry_succeeds_once() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let scope = Scope::new("charges")?;
    let k = key("k-rollback");
    {
        let tx = client.transaction().await?;
        let mut claim = new_claim(&tx, &scope, &k, &charge_fp(5)).await?;
        tx.execute("INSERT INTO orders (note) VALUES ('x')", &[])
            .await?;
        claim.enqueue("stripe", OutboxMessage::new("stripe", &1)?)?;
        claim.complete(&tx, &created("{}")).await?;
        // The handler fails here: the transaction is dropped, not committed.
    }
    assert_eq!(count(&client, "orders").await?, 0);
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 0);
    assert_eq!(count(&client, "txoutbox_messages").await?, 0);
    let response = charge(&mut client, &scope, &k, &charge_fp(5)).await?;
    assert_eq!(response.status, 201);
    assert_eq!(count(&client, "orders").await?, 1);
    Ok(())
}

#[tokio::test]
async fn dropped_connection_before_commit_leaves_nothing() -> TestResult {
    let (db, observer) = db_with_orders().await?;
    let scope = Scope::new("charges")?;
    let k = key("k-dropped");
    let (mut client, connection) = db.config()?.connect().await?;
    let driver = tokio::spawn(connection);
    let pid: i32 = value(&client, "SELECT pg_backend_pid()").await?;
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, &scope, &k, &charge_fp(5)).await?;
    tx.execute("INSERT INTO orders (note) VALUES ('x')", &[])
        .await?;
    claim.enqueue("stripe", OutboxMessage::new("stripe", &1)?)?;
    claim.complete(&tx, &created("{}")).await?;
    // The connection dies before COMMIT reaches the server.
    observer
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await?;
    let commit = tx.commit().await;
    assert!(commit.is_err(), "commit on a dead connection fails");
    let _ = driver.await;
    assert_eq!(count(&observer, "orders").await?, 0);
    assert_eq!(count(&observer, "txoutbox_idempotency_keys").await?, 0);
    assert_eq!(count(&observer, "txoutbox_messages").await?, 0);
    let mut retry = db.connect().await?;
    assert_eq!(
        charge(&mut retry, &scope, &k, &charge_fp(5)).await?.status,
        201
    );
    assert_eq!(count(&observer, "orders").await?, 1);
    Ok(())
}

#[tokio::test]
async fn fifty_concurrent_duplicates_make_one_effect() -> TestResult {
    let (db, observer) = db_with_orders().await?;
    let scope = Arc::new(Scope::new("charges")?.with_lock_timeout(Duration::from_secs(5))?);
    let k = key("k-concurrent");
    let answers = at_once(&db, 50, |mut client| {
        let (scope, k) = (scope.clone(), k.clone());
        async move { charge(&mut client, &scope, &k, &charge_fp(7)).await }
    })
    .await?
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    the_one_that_did_the_work(&answers);
    assert_eq!(count(&observer, "orders").await?, 1);
    assert_eq!(count(&observer, "txoutbox_messages").await?, 2);
    Ok(())
}

/// 50 requests with one key at once, each in a transaction of `level`: one does the work, every
/// other gets the stored answer or a 409 (never a 500 for a serialization failure), and a retry
/// of a 409 gets the stored answer.
async fn fifty_concurrent_duplicates_at(level: IsolationLevel) -> TestResult {
    let (db, observer) = db_with_orders().await?;
    let scope = Arc::new(Scope::new("charges")?.with_lock_timeout(Duration::from_secs(5))?);
    let k = key("k-isolation");
    let outcomes = at_once(&db, 50, |mut client| {
        let (scope, k) = (scope.clone(), k.clone());
        async move { charge_at(&mut client, Some(level), &scope, &k, &charge_fp(7)).await }
    })
    .await?;
    let mut answers = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(answer) => answers.push(answer.status),
            Err(e) => {
                assert_eq!(e.http_status(), 409, "{level:?}: {e}");
                answers.push(409);
            }
        }
    }
    assert!(
        answers.contains(&201),
        "{level:?}: one request did the work"
    );
    assert!(
        answers.iter().all(|s| *s == 201 || *s == 409),
        "{level:?}: every answer is the stored 201 or a 409, got {answers:?}"
    );
    assert_eq!(count(&observer, "orders").await?, 1, "{level:?}");
    assert_eq!(count(&observer, "txoutbox_messages").await?, 2, "{level:?}");
    let mut client = db.connect().await?;
    let retry = charge_at(&mut client, Some(level), &scope, &k, &charge_fp(7)).await?;
    assert_eq!(retry.status, 201, "a retry after a 409 is a replay");
    assert_eq!(count(&observer, "orders").await?, 1, "{level:?}");
    Ok(())
}

#[tokio::test]
async fn fifty_concurrent_duplicates_in_serializable_transactions_make_one_effect() -> TestResult {
    fifty_concurrent_duplicates_at(IsolationLevel::Serializable).await
}

#[tokio::test]
async fn fifty_concurrent_duplicates_in_repeatable_read_transactions_make_one_effect() -> TestResult
{
    fifty_concurrent_duplicates_at(IsolationLevel::RepeatableRead).await
}

#[tokio::test]
async fn a_serialization_failure_at_commit_is_a_409_conflict() -> TestResult {
    let (db, _observer) = db_with_orders().await?;
    let (mut a, mut b) = (db.connect().await?, db.connect().await?);
    let level = IsolationLevel::Serializable;
    let ta = a.build_transaction().isolation_level(level).start().await?;
    let tb = b.build_transaction().isolation_level(level).start().await?;
    // Write skew: each reads what the other writes.
    for tx in [&ta, &tb] {
        tx.query_one("SELECT count(*) FROM orders", &[]).await?;
    }
    for tx in [&ta, &tb] {
        tx.execute("INSERT INTO orders (note) VALUES ('x')", &[])
            .await?;
    }
    ta.commit().await?;
    let err = Error::from(
        tb.commit()
            .await
            .expect_err("SSI refuses the second commit"),
    );
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    assert_eq!(err.http_status(), 409);
    assert!(!err.is_unavailable());
    Ok(())
}

#[tokio::test]
async fn same_key_under_two_scopes_is_two_keys() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let k = key("k-scoped");
    let a = charge(&mut client, &Scope::new("tenant-a")?, &k, &charge_fp(1)).await?;
    let b = charge(&mut client, &Scope::new("tenant-b")?, &k, &charge_fp(1)).await?;
    assert_ne!(a.body, b.body, "two orders, two answers");
    assert_eq!(count(&client, "orders").await?, 2);
    assert_eq!(count(&client, "txoutbox_messages").await?, 4);
    Ok(())
}

#[tokio::test]
async fn expired_key_is_pruned_and_then_new() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let short = Scope::new("short")?.with_window(Duration::from_millis(300))?;
    let long = Scope::new("long")?;
    let k = key("k-expiry");
    charge(&mut client, &short, &k, &charge_fp(1)).await?;
    charge(&mut client, &long, &k, &charge_fp(1)).await?;
    keys_expired(&client, &short).await?;
    assert_eq!(txoutbox::admin::prune_expired_keys(&client, 1).await?, 1);
    let scopes: Vec<String> =
        column(&client, "SELECT scope FROM txoutbox_idempotency_keys").await?;
    assert_eq!(scopes, ["long"], "only the expired key is pruned");
    charge(&mut client, &short, &k, &charge_fp(1)).await?;
    assert_eq!(
        count(&client, "orders").await?,
        3,
        "after the window the key is new"
    );
    Ok(())
}

#[tokio::test]
async fn expired_key_not_yet_pruned_is_new() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let short = Scope::new("short")?.with_window(Duration::from_millis(200))?;
    let k = key("k-expired");
    charge(&mut client, &short, &k, &charge_fp(1)).await?;
    keys_expired(&client, &short).await?;
    let again = charge(&mut client, &short, &k, &charge_fp(2)).await?;
    assert_eq!(again.status, 201, "an expired key is not a mismatch");
    assert_eq!(count(&client, "orders").await?, 2);
    Ok(())
}

#[tokio::test]
async fn pruning_runs_in_bounded_batches() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let short = Scope::new("short")?.with_window(Duration::from_millis(100))?;
    for i in 0..25 {
        charge(&mut client, &short, &key(&format!("k-{i}")), &charge_fp(1)).await?;
    }
    keys_expired(&client, &short).await?;
    assert_eq!(txoutbox::admin::prune_expired_keys(&client, 10).await?, 25);
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 0);
    Ok(())
}

/// One claim of `k` with two effects; returns the downstream keys the claim gave them
/// (stripe, receipt), as it tells them.
async fn charge_telling_keys(
    client: &mut Client,
    scope: &Scope,
    k: &IdempotencyKey,
) -> anyhow::Result<(String, String)> {
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, scope, k, &charge_fp(1)).await?;
    tx.execute("INSERT INTO orders (note) VALUES ($1)", &[&k.as_str()])
        .await?;
    claim.enqueue(
        "stripe",
        OutboxMessage::new("stripe", &serde_json::json!({"amount": 1}))?,
    )?;
    claim.enqueue(
        "receipt",
        OutboxMessage::new("email", &serde_json::json!({"to": "a@b.c"}))?,
    )?;
    let keys = (
        claim.downstream_key("stripe"),
        claim.downstream_key("receipt"),
    );
    let enqueued = claim.complete(&tx, &created("{}")).await?;
    anyhow::ensure!(enqueued.all_written(), "{enqueued:?}");
    tx.commit().await?;
    Ok(keys)
}

async fn keys_of(client: &Client, destination: &str) -> anyhow::Result<Vec<String>> {
    Ok(client
        .query(
            "SELECT downstream_key FROM txoutbox_messages WHERE destination = $1 ORDER BY seq",
            &[&destination],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

#[tokio::test]
async fn effects_carry_the_downstream_keys_their_claim_tells() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let scope = Scope::new("charges")?;
    let k = key("k-derive");
    let (stripe, receipt) = charge_telling_keys(&mut client, &scope, &k).await?;
    assert_ne!(stripe, receipt, "two effects, two keys");
    // A retry within the window is a replay: nothing new, the same keys.
    charge(&mut client, &scope, &k, &charge_fp(1)).await?;
    assert_eq!(keys_of(&client, "stripe").await?, [stripe]);
    assert_eq!(keys_of(&client, "email").await?, [receipt]);
    Ok(())
}

#[tokio::test]
async fn a_key_reused_after_its_window_gets_new_downstream_keys() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let short = Scope::new("charges")?.with_window(Duration::from_millis(300))?;
    let k = key("k-reused");
    let (old_stripe, old_receipt) = charge_telling_keys(&mut client, &short, &k).await?;
    // The old charge was declined and dead-lettered; its row stays for the operator.
    client
        .execute(
            "UPDATE txoutbox_messages SET status = 'failed' WHERE destination = 'stripe'",
            &[],
        )
        .await?;
    keys_expired(&client, &short).await?;
    let (new_stripe, new_receipt) = charge_telling_keys(&mut client, &short, &k).await?;
    assert_ne!(new_stripe, old_stripe);
    assert_ne!(new_receipt, old_receipt);
    assert_eq!(
        keys_of(&client, "stripe").await?,
        [old_stripe, new_stripe],
        "the new request's effect is enqueued beside the dead-lettered one"
    );
    assert_eq!(keys_of(&client, "email").await?, [old_receipt, new_receipt]);
    assert_eq!(count(&client, "orders").await?, 2);
    Ok(())
}

#[tokio::test]
async fn a_key_pruned_then_reused_gets_new_downstream_keys() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let short = Scope::new("charges")?.with_window(Duration::from_millis(300))?;
    let k = key("k-pruned");
    let (old_stripe, _) = charge_telling_keys(&mut client, &short, &k).await?;
    keys_expired(&client, &short).await?;
    assert_eq!(txoutbox::admin::prune_expired_keys(&client, 10).await?, 1);
    let (new_stripe, _) = charge_telling_keys(&mut client, &short, &k).await?;
    assert_ne!(
        new_stripe, old_stripe,
        "a delivered old effect's key must not reach the downstream again"
    );
    assert_eq!(keys_of(&client, "stripe").await?, [old_stripe, new_stripe]);
    Ok(())
}

#[tokio::test]
async fn an_enqueue_deduplicated_away_is_reported() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let first = OutboxMessage::new("email", &1)?.with_downstream_key("digest-1");
    let again = OutboxMessage::new("email", &1)?.with_downstream_key("digest-1");
    let other = OutboxMessage::new("email", &2)?.with_downstream_key("digest-2");
    let tx = client.transaction().await?;
    let enqueued = enqueue(&tx, std::slice::from_ref(&first)).await?;
    assert_eq!(enqueued.written(), [first.id()]);
    assert!(enqueued.all_written());
    let enqueued = enqueue(&tx, &[again.clone(), other.clone()]).await?;
    assert_eq!(enqueued.written(), [other.id()]);
    assert_eq!(enqueued.skipped(), [again.id()]);
    tx.commit().await?;

    // Within a request: a message given a key already in the outbox is skipped, and told.
    let scope = Scope::new("charges")?;
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, &scope, &key("k-dup"), &charge_fp(1)).await?;
    let duplicate = OutboxMessage::new("email", &3)?.with_downstream_key("digest-1");
    let fresh = OutboxMessage::new("stripe", &4)?;
    claim.enqueue("digest", duplicate.clone())?;
    claim.enqueue("payment", fresh.clone())?;
    let enqueued = claim.complete(&tx, &created("{}")).await?;
    tx.commit().await?;
    assert_eq!(enqueued.written(), [fresh.id()]);
    assert_eq!(enqueued.skipped(), [duplicate.id()]);
    assert_eq!(count(&client, "txoutbox_messages").await?, 3);
    Ok(())
}

#[tokio::test]
async fn batch_enqueue_with_caller_key_deduplicates() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    for _ in 0..3 {
        let tx = client.transaction().await?;
        let message = OutboxMessage::new("email", &serde_json::json!({"n": 1}))?
            .with_downstream_key("nightly-2026-12-02:digest");
        enqueue(&tx, &[message]).await?;
        tx.commit().await?;
    }
    assert_eq!(count(&client, "txoutbox_messages").await?, 1);
    let tx = client.transaction().await?;
    let inserted = enqueue(
        &tx,
        &[
            OutboxMessage::new("email", &1)?.with_downstream_key("a"),
            OutboxMessage::new("email", &2)?.with_downstream_key("a"),
            OutboxMessage::new("sms", &3)?.with_downstream_key("a"),
        ],
    )
    .await?;
    assert_eq!(
        inserted.written().len(),
        2,
        "one row per (destination, downstream key)"
    );
    assert_eq!(inserted.skipped().len(), 1);
    Ok(())
}

#[tokio::test]
async fn batch_enqueue_without_key_is_refused() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let tx = client.transaction().await?;
    let err = enqueue(&tx, &[OutboxMessage::new("email", &1)?])
        .await
        .expect_err("a key is required");
    assert!(matches!(err, Error::Invalid(_)));
    tx.commit().await?;
    assert_eq!(count(&client, "txoutbox_messages").await?, 0);
    Ok(())
}

#[tokio::test]
async fn server_errors_are_not_stored() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let scope = Scope::new("charges")?;
    let tx = client.transaction().await?;
    let claim = new_claim(&tx, &scope, &key("k-500"), &charge_fp(1)).await?;
    let err = claim
        .complete(&tx, &empty_answer(503))
        .await
        .expect_err("5xx refused");
    assert!(matches!(err, Error::Invalid(_)));
    drop(tx);
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 0);
    Ok(())
}

#[tokio::test]
async fn business_4xx_outcomes_are_stored_and_replayed() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let scope = Scope::new("inventory")?;
    let k = key("k-409");
    let short = StoredResponse {
        status: 409,
        headers: vec![],
        body: br#"{"error":"insufficient inventory"}"#.to_vec(),
    };
    let tx = client.transaction().await?;
    let claim = new_claim(&tx, &scope, &k, &charge_fp(1)).await?;
    claim.complete(&tx, &short).await?;
    tx.commit().await?;
    let tx = client.transaction().await?;
    assert!(matches!(begin(&tx, &scope, &k, &charge_fp(1)).await?, Begin::Replay(r) if r == short));
    Ok(())
}

#[tokio::test]
async fn sql_metacharacters_in_every_field_are_stored_verbatim() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let evil = "'); DROP TABLE orders; --\\$1\"";
    let scope = Scope::new(evil)?;
    let k = key("';DROP_TABLE_orders;--");
    let tx = client.transaction().await?;
    let mut claim = new_claim(
        &tx,
        &scope,
        &k,
        &Fingerprint::new(evil, evil, evil.as_bytes()),
    )
    .await?;
    claim.enqueue(
        evil,
        OutboxMessage::new(evil, &serde_json::json!({ evil: evil }))?
            .with_header(evil, evil)
            .with_ordering_key(evil),
    )?;
    let response = StoredResponse {
        status: 200,
        headers: vec![(evil.into(), evil.into())],
        body: evil.as_bytes().to_vec(),
    };
    claim.complete(&tx, &response).await?;
    tx.commit().await?;
    let row = client
        .query_one(
            "SELECT destination, payload, headers, ordering_key FROM txoutbox_messages",
            &[],
        )
        .await?;
    assert_eq!(row.get::<_, String>(0), evil);
    assert_eq!(
        row.get::<_, serde_json::Value>(1),
        serde_json::json!({ evil: evil })
    );
    assert_eq!(
        row.get::<_, serde_json::Value>(2),
        serde_json::json!({ evil: evil })
    );
    assert_eq!(row.get::<_, String>(3), evil);
    let tx = client.transaction().await?;
    let replay = begin(
        &tx,
        &scope,
        &k,
        &Fingerprint::new(evil, evil, evil.as_bytes()),
    )
    .await?;
    assert!(matches!(replay, Begin::Replay(r) if r == response));
    drop(tx);
    assert_eq!(
        count(&client, "orders").await?,
        0,
        "the table is still there"
    );
    Ok(())
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_writes_nothing() -> TestResult {
    let (_db, client) = db_with_orders().await?;
    assert_eq!(
        IdempotencyKey::parse(&"x".repeat(256)),
        Err(KeyError::TooLong(256))
    );
    assert!(matches!(
        IdempotencyKey::parse("ключ"),
        Err(KeyError::InvalidCharacter(0))
    ));
    assert!(matches!(IdempotencyKey::parse(""), Err(KeyError::Missing)));
    assert!(matches!(Scope::new(""), Err(Error::Invalid(_))));
    assert!(matches!(
        Scope::new("x".repeat(256)),
        Err(Error::Invalid(_))
    ));

    struct Unserialisable;
    impl serde::Serialize for Unserialisable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("refuses to serialise"))
        }
    }
    assert!(matches!(
        OutboxMessage::new("email", &Unserialisable),
        Err(Error::Payload(_))
    ));
    assert_eq!(count(&client, "txoutbox_messages").await?, 0);
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 0);
    Ok(())
}

#[tokio::test]
async fn the_same_effect_name_twice_is_refused() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, &Scope::new("s")?, &key("k"), &charge_fp(1)).await?;
    claim.enqueue("email", OutboxMessage::new("email", &1)?)?;
    assert!(matches!(
        claim.enqueue("email", OutboxMessage::new("email", &2)?),
        Err(Error::Invalid(_))
    ));
    Ok(())
}

#[tokio::test]
async fn unreachable_store_is_unavailable_not_new() -> TestResult {
    let (cluster, db) = Cluster::private_with_db().await?;
    let pool = db.pool(2)?;
    {
        let mut client = pool.get().await?;
        client
            .batch_execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL)")
            .await?;
        let tx = client.transaction().await?;
        cluster.stop()?;
        let err = begin(&tx, &Scope::new("s")?, &key("k"), &charge_fp(1))
            .await
            .expect_err("the server is down");
        assert!(err.is_unavailable(), "got {err:?}");
        assert_eq!(err.http_status(), 503);
    }
    let err = pool
        .get()
        .await
        .map_err(txoutbox::Error::from)
        .expect_err("down");
    assert!(err.is_unavailable(), "got {err:?}");
    cluster.start()?;
    let mut client = db.connect().await?;
    assert_eq!(
        charge(&mut client, &Scope::new("s")?, &key("k"), &charge_fp(1))
            .await?
            .status,
        201
    );
    drop(client);
    drop(pool);
    drop(db);
    Ok(())
}

#[tokio::test]
async fn relay_waker_sends_a_hint_after_commit() -> TestResult {
    let db = test_db().await?;
    let (listener, mut connection) = db.config()?.connect().await?;
    let (sender, mut hints) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = sender.send(n.channel().to_owned());
            }
        }
    });
    listener.batch_execute("LISTEN txoutbox_wake").await?;
    let waker = RelayWaker::spawn(db.pool(1)?);
    for _ in 0..100 {
        waker.wake();
    }
    let channel = tokio::time::timeout(Duration::from_secs(5), hints.recv()).await?;
    assert_eq!(channel.as_deref(), Some("txoutbox_wake"));
    Ok(())
}

#[tokio::test]
async fn migrating_twice_is_a_no_op() -> TestResult {
    let (_db, mut client) = test_db_with_client().await?;
    let applied = txoutbox::migrate(&mut client).await?;
    assert!(applied.is_empty(), "the template was migrated already");
    let again = txoutbox::migrate(&mut client).await?;
    assert!(again.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_pooled_transaction_uses_cached_statements_with_the_same_outcomes() -> TestResult {
    let (db, observer) = db_with_orders().await?;
    let pool = db.pool(1)?;
    let scope = Scope::new("charges")?;
    let k = key("k-pooled");
    for round in 0..3 {
        let mut client = pool.get().await?;
        let tx = client.transaction().await?;
        match begin(&tx, &scope, &k, &charge_fp(1)).await? {
            Begin::New(mut claim) => {
                assert_eq!(round, 0, "only the first request is new");
                claim.enqueue("receipt", OutboxMessage::new("email", &1)?)?;
                claim.complete(&tx, &created("{}")).await?;
                tx.commit().await?;
            }
            Begin::Replay(stored) => {
                assert_eq!(stored, created("{}"));
                drop(tx);
            }
            other => panic!("unexpected {other:?}"),
        }
        let tx = client.transaction().await?;
        assert!(matches!(
            begin(&tx, &scope, &k, &charge_fp(2)).await?,
            Begin::Mismatch
        ));
    }
    let cached: i64 = pool
        .get()
        .await?
        .query_one("SELECT count(*) FROM pg_prepared_statements", &[])
        .await?
        .get(0);
    assert!(
        cached >= 3,
        "claim, lookup and complete are prepared once ({cached})"
    );
    assert_eq!(count(&observer, "txoutbox_messages").await?, 1);
    Ok(())
}

#[tokio::test]
async fn the_callers_lock_timeout_is_restored_after_a_replay() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let scope = Scope::new("s")?;
    charge(&mut client, &scope, &key("k"), &charge_fp(1)).await?;
    client.batch_execute("SET lock_timeout = '7s'").await?;
    let tx = client.transaction().await?;
    assert!(matches!(
        begin(&tx, &scope, &key("k"), &charge_fp(1)).await?,
        Begin::Replay(_)
    ));
    let timeout: String = value(&tx, "SHOW lock_timeout").await?;
    assert_eq!(timeout, "7s");
    Ok(())
}

#[tokio::test]
async fn a_claim_completed_in_another_transaction_is_an_internal_error_not_a_client_one(
) -> TestResult {
    let (db, mut client) = db_with_orders().await?;
    let mut other = db.connect().await?;
    let scope = Scope::new("charges")?;
    let tx = client.transaction().await?;
    let claim = new_claim(&tx, &scope, &key("k-elsewhere"), &charge_fp(1)).await?;
    // The key row is not committed, so the other connection's transaction cannot see it.
    let elsewhere = other.transaction().await?;
    let err = claim
        .complete(&elsewhere, &empty_created())
        .await
        .expect_err("the key is not in that transaction");
    assert!(matches!(err, Error::Internal(_)), "{err:?}");
    assert_eq!(err.http_status(), 500);
    drop(elsewhere);
    drop(tx);
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 0);
    Ok(())
}
