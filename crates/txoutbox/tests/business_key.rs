//! The business row as the key record (`txoutbox::idempotency::BusinessKey`): no key row, the
//! service's own `UNIQUE` column decides, against a real Postgres.

use std::sync::Arc;

use tokio_postgres::types::Type;
use tokio_postgres::Client;
use txoutbox::idempotency::{derive_downstream_key, BusinessKey, RowBegin};
use txoutbox::{Fingerprint, IdempotencyKey, OutboxMessage, Scope};
use txoutbox_test_support::request::create_charges;
use txoutbox_test_support::select::value;
use txoutbox_test_support::{count, test_db_with_client, TestDb};

type TestResult = anyhow::Result<()>;

const LOOKUP: &str = "SELECT * FROM charges WHERE idempotency_key = $1";
const INSERT: &str = "INSERT INTO charges (amount, idempotency_key, request_fingerprint) \
     VALUES ($1, $2, $3) ON CONFLICT (idempotency_key) DO NOTHING RETURNING *";

async fn db_with_charges() -> anyhow::Result<(TestDb, Client)> {
    let (db, client) = test_db_with_client().await?;
    create_charges(&client).await?;
    Ok((db, client))
}

fn charges() -> anyhow::Result<BusinessKey> {
    Ok(BusinessKey::new(
        Scope::new("charges")?,
        LOOKUP,
        "request_fingerprint",
    ))
}

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::parse(s).expect("valid key")
}

fn fingerprint(amount: i64) -> Fingerprint {
    Fingerprint::new(
        "POST",
        "/charge",
        format!("{{\"amount\":{amount}}}").as_bytes(),
    )
}

/// Runs the charge insert for `amount` under key `k` in `tx`.
async fn begin_charge(
    tx: &tokio_postgres::Transaction<'_>,
    k: &IdempotencyKey,
    amount: i64,
) -> anyhow::Result<RowBegin> {
    let fp = fingerprint(amount);
    let fp_bytes: &[u8] = fp.as_bytes();
    Ok(charges()?
        .begin(
            tx,
            k,
            &fp,
            INSERT,
            &[
                (&amount, Type::INT8),
                (&k.as_str(), Type::TEXT),
                (&fp_bytes, Type::BYTEA),
            ],
        )
        .await?)
}

/// What a handler answers: the charge's id (new or replayed), or 422 / 409.
#[derive(Debug, PartialEq)]
enum Answer {
    Created(i64),
    Replayed(i64),
    Mismatch,
    InFlight,
}

/// The handler: one charge row, two effects, committed together.
async fn charge(client: &mut Client, k: &IdempotencyKey, amount: i64) -> anyhow::Result<Answer> {
    let tx = client.transaction().await?;
    let begun = begin_charge(&tx, k, amount).await?;
    Ok(match begun {
        RowBegin::New { row, mut claim } => {
            claim.enqueue(
                "receipt",
                OutboxMessage::new("email", &serde_json::json!({ "amount": amount }))?,
            )?;
            claim.enqueue(
                "payment",
                OutboxMessage::new("stripe", &serde_json::json!({ "amount": amount }))?,
            )?;
            claim.complete(&tx).await?;
            tx.commit().await?;
            Answer::Created(row.try_get("id")?)
        }
        RowBegin::Replay(row) => Answer::Replayed(row.try_get("id")?),
        RowBegin::Mismatch => Answer::Mismatch,
        RowBegin::InFlight => Answer::InFlight,
    })
}

/// A database where a request under key `k` (made of `key`) charged 100: the client and `k`.
async fn charged_once(key_text: &str) -> anyhow::Result<(TestDb, Client, IdempotencyKey)> {
    let (db, mut client) = db_with_charges().await?;
    let k = key(key_text);
    charge(&mut client, &k, 100).await?;
    Ok((db, client, k))
}

/// Whatever the requests were, one charge row was written, with its two effects, and no key row:
/// the business row is the record.
async fn one_charge_and_its_two_effects(client: &Client) -> anyhow::Result<()> {
    assert_eq!(count(client, "charges").await?, 1);
    assert_eq!(count(client, "txoutbox_messages").await?, 2);
    assert_eq!(
        count(client, "txoutbox_idempotency_keys").await?,
        0,
        "no key row: the business row is the record"
    );
    Ok(())
}

#[tokio::test]
async fn fifty_concurrent_requests_with_one_key_make_one_row_and_one_set_of_effects() -> TestResult
{
    let (db, client) = db_with_charges().await?;
    let db = Arc::new(db);
    let k = key("bk-concurrent-0000001");
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let db = db.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = db.connect().await?;
            charge(&mut client, &k, 100).await
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await??);
    }
    let created: Vec<i64> = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Created(id) => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(created.len(), 1, "{answers:?}");
    for answer in &answers {
        assert!(
            matches!(answer, Answer::Created(_))
                || *answer == Answer::Replayed(created[0])
                || *answer == Answer::InFlight,
            "{answer:?}"
        );
    }
    one_charge_and_its_two_effects(&client).await?;
    Ok(())
}

#[tokio::test]
async fn a_retry_is_answered_from_the_first_requests_row_and_enqueues_nothing() -> TestResult {
    let (_db, mut client) = db_with_charges().await?;
    let k = key("bk-retry-000000000001");
    let Answer::Created(id) = charge(&mut client, &k, 100).await? else {
        panic!("the first request is new");
    };
    assert_eq!(charge(&mut client, &k, 100).await?, Answer::Replayed(id));
    one_charge_and_its_two_effects(&client).await?;
    Ok(())
}

#[tokio::test]
async fn the_same_key_with_another_body_is_a_mismatch_and_writes_nothing() -> TestResult {
    let (_db, mut client, k) = charged_once("bk-mismatch-000000001").await?;
    assert_eq!(charge(&mut client, &k, 999).await?, Answer::Mismatch);
    let amount: i64 = value(&client, "SELECT amount FROM charges").await?;
    assert_eq!(amount, 100);
    assert_eq!(count(&client, "txoutbox_messages").await?, 2);
    Ok(())
}

#[tokio::test]
async fn a_request_that_cannot_wait_for_the_holder_is_in_flight() -> TestResult {
    let (db, mut client) = db_with_charges().await?;
    let k = key("bk-in-flight-00000001");
    let charges = charges()?;
    let fp = fingerprint(100);
    let fp_bytes: &[u8] = fp.as_bytes();
    let amount: i64 = 100;
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 3] = [
        (&amount, Type::INT8),
        (&"bk-in-flight-00000001", Type::TEXT),
        (&fp_bytes, Type::BYTEA),
    ];
    // The first request holds the key, uncommitted.
    let holder = client.transaction().await?;
    let RowBegin::New { .. } = charges.begin(&holder, &k, &fp, INSERT, &params).await? else {
        panic!("the first request is new");
    };
    let mut other = db.connect().await?;
    let tx = other.transaction().await?;
    tx.batch_execute("SET LOCAL lock_timeout = '100ms'").await?;
    let begun = charges.begin(&tx, &k, &fp, INSERT, &params).await?;
    assert!(matches!(begun, RowBegin::InFlight), "{begun:?}");
    drop(tx);
    holder.rollback().await?;
    // The holder rolled back: the key is free and the next request is new.
    assert!(matches!(
        charge(&mut other, &k, 100).await?,
        Answer::Created(_)
    ));
    Ok(())
}

#[tokio::test]
async fn effects_carry_keys_derived_from_scope_key_and_effect() -> TestResult {
    let (_db, client, k) = charged_once("bk-derived-0000000001").await?;
    let rows = client
        .query(
            "SELECT destination, downstream_key FROM txoutbox_messages ORDER BY destination",
            &[],
        )
        .await?;
    let keys: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        keys,
        vec![
            (
                "email".to_owned(),
                derive_downstream_key("charges", &k, "receipt")
            ),
            (
                "stripe".to_owned(),
                derive_downstream_key("charges", &k, "payment")
            ),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn the_same_effect_name_twice_is_refused() -> TestResult {
    let (_db, mut client) = db_with_charges().await?;
    let k = key("bk-twice-000000000001");
    let tx = client.transaction().await?;
    let RowBegin::New { mut claim, .. } = begin_charge(&tx, &k, 1).await? else {
        panic!("new key");
    };
    claim.enqueue("email", OutboxMessage::new("email", &1)?)?;
    assert!(matches!(
        claim.enqueue("email", OutboxMessage::new("email", &2)?),
        Err(txoutbox::Error::Invalid(_))
    ));
    Ok(())
}

#[tokio::test]
async fn the_requests_traceparent_reaches_its_effects() -> TestResult {
    let (_db, mut client) = db_with_charges().await?;
    let k = key("bk-traced-00000000001");
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tx = client.transaction().await?;
    let RowBegin::New { mut claim, .. } = begin_charge(&tx, &k, 1).await? else {
        panic!("new key");
    };
    claim.enqueue("email", OutboxMessage::new("email", &1)?)?;
    claim.with_traceparent(traceparent)?;
    claim.complete(&tx).await?;
    tx.commit().await?;
    let stored: String = value(
        &client,
        "SELECT headers->>'traceparent' FROM txoutbox_messages",
    )
    .await?;
    assert_eq!(stored, traceparent);
    Ok(())
}
