//! Rows written by another program that this build cannot decode (JSON Postgres accepts and
//! serde_json refuses): each fails its own row only. The relay dead-letters such an outbox row at
//! once with a readable error and one attempt logged, and delivers the rows claimed with it; a
//! key row's undecodable stored response fails its own request, not the others.

use txoutbox::{begin, Begin, Error, Scope, StoredResponse};
use txoutbox_test_support::hooks::{charge_status, charges_table, MarkCharge};
use txoutbox_test_support::request::{charge_fingerprint, key};

use txoutbox::admin::MessageStatus;
use txoutbox_test_support::factory::{message, nested_too_deep};
use txoutbox_test_support::relay::{relay_config, RecordingSink, RunningRelay};
use txoutbox_test_support::{
    eventually_async, outcomes, status, test_db, test_db_with_client, wait_until, TestDb,
};

type TestResult = anyhow::Result<()>;

/// What became of the hostile row among 30 ordinary ones after a relay ran.
struct Outcome {
    delivered: i64,
    status: String,
    last_error: String,
    /// The attempt log's rows for it: (outcome, error).
    attempts: Vec<(String, Option<String>)>,
    /// Calls its sink got with its key.
    calls: usize,
}

/// Writes the hostile row first (the oldest, so it is in the first claim), then 30 ordinary rows,
/// runs a relay until the 30 are delivered and the hostile one is no longer in flight.
async fn one_hostile_row_among_thirty(
    db: &TestDb,
    hostile: txoutbox_test_support::factory::MessageFactory<'_>,
) -> anyhow::Result<Outcome> {
    let client = db.connect().await?;
    hostile.key("hostile").create().await?;
    message(db).key("ordinary").create_many(30).await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(
        db.relay()?
            .config(relay_config())
            .sink("test", sink.clone())
            .build()?,
    );
    let delivered = wait_until(&client, |c| c.delivered >= 30).await?.delivered;
    eventually_async(
        "the hostile row was attempted and is out of flight",
        || async {
            let now = status(&client, "hostile").await?;
            Ok(now.is_some_and(|s| s != MessageStatus::InFlight)
                && !outcomes(&client, "hostile").await?.is_empty())
        },
    )
    .await?;
    relay.stop().await?;
    let row = client
        .query_one(
            "SELECT status, coalesce(last_error, '') FROM txoutbox_messages \
             WHERE downstream_key = 'hostile'",
            &[],
        )
        .await?;
    let attempts = client
        .query(
            "SELECT outcome, error FROM txoutbox_attempts WHERE downstream_key = 'hostile'",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(Outcome {
        delivered,
        status: row.get(0),
        last_error: row.get(1),
        attempts,
        calls: sink.keys().iter().filter(|k| *k == "hostile").count(),
    })
}

/// The hostile row was dead-lettered at once, alone, with an error that says `cause`; a failure
/// names the `case`.
fn assert_failed_alone(case: &str, outcome: &Outcome, cause: &str) {
    assert_eq!(
        outcome.delivered, 30,
        "{case}: every batch-mate is delivered"
    );
    assert_eq!(outcome.status, "failed", "{case}: {}", outcome.last_error);
    assert!(
        outcome.last_error.contains(cause),
        "{case}: the error names the cause: {}",
        outcome.last_error
    );
    assert!(
        !outcome.last_error.contains("unavailable"),
        "{case}: {}",
        outcome.last_error
    );
    assert_eq!(
        outcome.attempts,
        vec![("failed".to_owned(), Some(outcome.last_error.clone()))],
        "{case}: one attempt, logged with its reason"
    );
    assert_eq!(outcome.calls, 0, "{case}: its sink was never called");
}

/// Which stored column of the hostile row holds the undecodable JSON.
enum Stored {
    Payload(String),
    Headers(String),
}

/// A payload nested too deep, a payload number beyond f64 and headers nested too deep: each fails
/// its own row, and the batch claimed with it is delivered (each case on a database of its own).
#[tokio::test]
async fn an_undecodable_payload_or_headers_fails_its_own_row_and_its_batch_is_delivered(
) -> TestResult {
    let cases = [
        (
            "a payload nested too deep",
            Stored::Payload(nested_too_deep()),
            "the stored payload is not valid for this relay: recursion limit exceeded",
        ),
        (
            "a payload number beyond f64",
            Stored::Payload(r#"{"n": 1e400}"#.to_owned()),
            "the stored payload is not valid for this relay: number out of range",
        ),
        (
            "headers nested too deep",
            Stored::Headers(format!(r#"{{"traceparent": {}}}"#, nested_too_deep())),
            "the stored headers are not valid for this relay (an object of strings): invalid type",
        ),
    ];
    for (case, stored, cause) in cases {
        let db = test_db().await?;
        let hostile = match &stored {
            Stored::Payload(json) => message(&db).stored_payload(json),
            Stored::Headers(json) => message(&db).stored_headers(json),
        };
        let outcome = one_hostile_row_among_thirty(&db, hostile).await?;
        assert_failed_alone(case, &outcome, cause);
    }
    Ok(())
}

/// Runs one request with key `k`: a new key stores a 201 and commits; returns what `begin`
/// answered (the replay of a stored key), or its error.
async fn request(
    client: &mut tokio_postgres::Client,
    scope: &Scope,
    k: &str,
) -> Result<Begin, Error> {
    let tx = client.transaction().await?;
    let begun = begin(&tx, scope, &key(k), &charge_fingerprint(1)).await?;
    if let Begin::New(claim) = begun {
        let response = StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: b"{}".to_vec(),
        };
        claim.complete(&tx, &response).await?;
        tx.commit().await?;
        return Ok(Begin::Replay(response));
    }
    Ok(begun)
}

#[tokio::test]
async fn a_stored_response_that_cannot_be_decoded_fails_its_own_key_only() -> TestResult {
    let (_db, mut client) = test_db_with_client().await?;
    let scope = Scope::new("charges")?;
    let hostile = [
        ("k-hostile-deep-0000", nested_too_deep()),
        ("k-hostile-number-00", r#"[["n", 1e400]]"#.to_owned()),
        (
            "k-hostile-shape-000",
            r#"{"content-type": "text/plain"}"#.to_owned(),
        ),
    ];
    for (k, headers) in &hostile {
        assert!(matches!(
            request(&mut client, &scope, k).await?,
            Begin::Replay(_)
        ));
        client
            .execute(
                "UPDATE txoutbox_idempotency_keys SET response_headers = $2::text::jsonb \
                 WHERE key = $1",
                &[k, headers],
            )
            .await?;
    }
    for (k, _) in &hostile {
        let err = match request(&mut client, &scope, k).await {
            Err(err) => err,
            Ok(other) => panic!("{k}: answered {other:?}"),
        };
        assert!(matches!(err, Error::Undecodable { .. }), "{k}: {err:?}");
        let source = std::error::Error::source(&err).expect("the decoder's error");
        assert!(source.is::<serde_json::Error>(), "{k}: {source:?}");
        assert!(!err.is_unavailable(), "{k}: {err}");
        assert_eq!(err.http_status(), 500);
        let text = err.to_string();
        assert!(
            text.contains(k) && text.contains("stored response headers"),
            "names the key and the column: {text}"
        );
    }
    // Other keys, new and stored, go on.
    assert!(matches!(
        request(&mut client, &scope, "k-ordinary-000000").await?,
        Begin::Replay(_)
    ));
    let Begin::Replay(replayed) = request(&mut client, &scope, "k-ordinary-000000").await? else {
        panic!("a stored key replays");
    };
    assert_eq!(replayed.status, 201);
    Ok(())
}

#[tokio::test]
async fn a_column_the_driver_cannot_decode_is_undecodable_not_an_outage() -> TestResult {
    let (_db, client) = test_db_with_client().await?;
    let row = client
        .query_one(&format!("SELECT '{}'::jsonb", nested_too_deep()), &[])
        .await?;
    let decode_error = row
        .try_get::<_, serde_json::Value>(0)
        .expect_err("serde_json refuses 200 levels");
    let err = Error::from(decode_error);
    assert!(matches!(err, Error::Undecodable { .. }), "{err:?}");
    let source = std::error::Error::source(&err).expect("the driver's error");
    assert!(source.is::<tokio_postgres::Error>(), "{source:?}");
    assert!(!err.is_unavailable());
    assert!(
        err.to_string().contains("recursion limit exceeded"),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn an_undecodable_row_of_a_hooked_destination_fails_without_calling_the_hook() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    message(&db)
        .key("hostile")
        .stored_payload(&nested_too_deep())
        .create()
        .await?;
    message(&db).key("ordinary").create_many(5).await?;
    let ordinary: Vec<String> = (0..5).map(|i| format!("ordinary-{i}")).collect();
    let mut charged: Vec<&str> = ordinary.iter().map(String::as_str).collect();
    charged.push("hostile");
    charges_table(&client, &charged).await?;
    let relay = RunningRelay::start(
        db.relay()?
            .config(relay_config())
            .sink("test", RecordingSink::new())
            .hook("test", MarkCharge::default())
            .build()?,
    );
    let reached = wait_until(&client, |c| c.delivered >= 5 && c.failed >= 1).await?;
    relay.stop().await?;
    assert_eq!((reached.delivered, reached.failed), (5, 1));
    assert_eq!(
        status(&client, "hostile").await?,
        Some(MessageStatus::Failed)
    );
    // The hook marks the charge of each row it is called for, delivered or dead-lettered.
    for key in &ordinary {
        assert_eq!(charge_status(&client, key).await?, "succeeded", "{key}");
    }
    assert_eq!(
        charge_status(&client, "hostile").await?,
        "pending",
        "the hook saw the delivered rows only"
    );
    Ok(())
}
