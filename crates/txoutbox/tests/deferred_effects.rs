//! One row per request: a scope with deferred effects stores the key, the response and the
//! effects on one row, and the relay fans the effects out; `Claim::commit` stores the key and
//! commits in one round trip. Against a real Postgres and a real relay.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::IsolationLevel;

use txoutbox::relay::Relay;
use txoutbox::{admin, StoredResponse};
use txoutbox::{begin, Begin, Claim, Error, IdempotencyKey, OutboxMessage, Scope};
use txoutbox_test_support::relay::relay_config;
use txoutbox_test_support::relay::{RecordingSink, RunningRelay};
use txoutbox_test_support::{
    count, keys_expired, keys_with_effects, RelayEvent, RelayEvents, TestDb,
};

type TestResult = anyhow::Result<()>;

use txoutbox_test_support::request::{
    at_once, charge_fingerprint as fingerprint, db_with_orders, empty_answer, key, new_claim,
    store_key_without_the_lock, the_one_that_did_the_work,
};
use txoutbox_test_support::select::{column, value_with};

fn created(id: i64) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!(r#"{{"order":{id}}}"#).into_bytes(),
    }
}

fn deferred() -> anyhow::Result<Scope> {
    Ok(Scope::new("charges")?
        .with_lock_timeout(Duration::from_secs(5))?
        .with_deferred_effects())
}

/// The order's business row and its two effects, enqueued on `claim`.
async fn order(
    tx: &tokio_postgres::Transaction<'_>,
    claim: &mut Claim,
    k: &IdempotencyKey,
) -> anyhow::Result<i64> {
    let id: i64 = value_with(
        tx,
        "INSERT INTO orders (note) VALUES ($1) RETURNING id",
        &[&k.as_str()],
    )
    .await?;
    claim.enqueue(
        "charge",
        OutboxMessage::new("stripe", &serde_json::json!({"order": id, "amount": 100}))?,
    )?;
    claim.enqueue(
        "receipt",
        OutboxMessage::new("email", &serde_json::json!({"order": id}))?,
    )?;
    Ok(id)
}

/// One request through [`Claim::commit`]: the stored answer (the first request's for a replay),
/// or the status of a refusal.
async fn request(
    client: &mut tokio_postgres::Client,
    scope: &Scope,
    k: &IdempotencyKey,
) -> Result<StoredResponse, Error> {
    let tx = client.transaction().await?;
    match begin(&tx, scope, k, &fingerprint(100)).await? {
        Begin::New(mut claim) => {
            let id = order(&tx, &mut claim, k)
                .await
                .map_err(|e| Error::Internal(e.to_string()))?;
            let response = created(id);
            claim.commit(tx, &response).await?;
            Ok(response)
        }
        Begin::Replay(stored) => Ok(stored),
        Begin::Mismatch | Begin::InFlight => Ok(empty_answer(409)),
    }
}

fn relay(db: &TestDb, sink: &RecordingSink) -> anyhow::Result<Relay> {
    Ok(db
        .relay()?
        .sink("stripe", sink.clone())
        .sink("email", sink.clone())
        .build()?)
}

/// Runs a relay until `n` effects reached its sink, then stops it: their downstream keys, sorted.
async fn fan_out(db: &TestDb, n: usize) -> anyhow::Result<Vec<String>> {
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(relay(db, &sink)?);
    assert_eq!(sink.wait_for(n, Duration::from_secs(10)).await, n);
    relay.stop().await?;
    let mut keys = sink.keys();
    keys.sort();
    Ok(keys)
}

/// A running relay like [`relay`]'s, with the test timings, its test events watched.
struct Watched {
    sink: RecordingSink,
    events: RelayEvents,
    relay: RunningRelay,
}

/// Starts a [`Watched`] relay over `db`.
fn watched(db: &TestDb) -> anyhow::Result<Watched> {
    let sink = RecordingSink::new();
    let events = RelayEvents::new();
    let relay = RunningRelay::start(
        db.relay()?
            .config(events.config(relay_config()))
            .sink("stripe", sink.clone())
            .sink("email", sink.clone())
            .build()?,
    );
    Ok(Watched {
        sink,
        events,
        relay,
    })
}

const EFFECTS_ON_KEYS: &str = "SELECT coalesce(sum(jsonb_array_length(effects)), 0)::int8 \
     FROM txoutbox_idempotency_keys";

#[tokio::test]
async fn a_deferred_request_writes_one_row_and_the_relay_delivers_its_effects() -> TestResult {
    let (db, mut client) = db_with_orders().await?;
    let scope = deferred()?;
    let k = key("k-one-row");
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, &scope, &k, &fingerprint(100)).await?;
    let keys = [
        claim.downstream_key("charge"),
        claim.downstream_key("receipt"),
    ];
    let id = order(&tx, &mut claim, &k).await?;
    let enqueued = claim.complete(&tx, &created(id)).await?;
    tx.commit().await?;
    assert_eq!(enqueued.written().len(), 2);
    assert!(enqueued.all_written());

    // Besides the business row, the request wrote one row: its key, carrying both effects.
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 1);
    assert_eq!(count(&client, "txoutbox_messages").await?, 0);
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 2);

    let delivered = fan_out(&db, 2).await?;
    let mut expected = keys.to_vec();
    expected.sort();
    assert_eq!(delivered, expected, "each effect carries its claim's key");
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 0);
    assert_eq!(count(&client, "txoutbox_delivered").await?, 2);
    // The enqueue time of the fanned-out rows is the request's.
    let same_time: Vec<String> = column(
        &client,
        "SELECT d.downstream_key FROM txoutbox_delivered d \
             JOIN txoutbox_idempotency_keys k ON d.created_at = k.created_at ORDER BY 1",
    )
    .await?;
    assert_eq!(same_time, expected);

    // The retry is answered from the key row.
    let again = request(&mut client, &scope, &k).await?;
    assert_eq!(again, created(id));
    Ok(())
}

#[tokio::test]
async fn fifty_concurrent_deferred_requests_with_one_key_make_one_set_of_effects() -> TestResult {
    let (db, observer) = db_with_orders().await?;
    let scope = Arc::new(deferred()?);
    let k = key("k-fifty");
    let answers = at_once(&db, 50, |mut client| {
        let (scope, k) = (scope.clone(), k.clone());
        async move { request(&mut client, &scope, &k).await }
    })
    .await?
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    the_one_that_did_the_work(&answers);
    assert_eq!(count(&observer, "orders").await?, 1);
    assert_eq!(count(&observer, EFFECTS_ON_KEYS).await?, 2);

    let Watched {
        sink,
        mut events,
        relay,
    } = watched(&db)?;
    assert_eq!(sink.wait_for(2, Duration::from_secs(10)).await, 2);
    // Nothing more comes: one set of effects. (A claim begun after the deliveries; a row it
    // took would be called before the stop returns.)
    events.claims(2).await?;
    relay.stop().await?;
    assert_eq!(sink.count(), 2);
    Ok(())
}

#[tokio::test]
async fn a_key_carrying_effects_is_not_pruned_until_the_relay_has_fanned_them_out() -> TestResult {
    let (db, mut client) = db_with_orders().await?;
    let scope = deferred()?.with_window(Duration::from_millis(1))?;
    request(&mut client, &scope, &key("k-prune")).await?;
    keys_expired(&client, &scope).await?;
    assert_eq!(admin::prune_expired_keys(&client, 100).await?, 0);
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 2);

    fan_out(&db, 2).await?;
    assert_eq!(admin::prune_expired_keys(&client, 100).await?, 1);
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 0);
    Ok(())
}

#[tokio::test]
async fn an_expired_key_taken_over_keeps_the_first_requests_effects() -> TestResult {
    let (db, mut client) = db_with_orders().await?;
    let scope = deferred()?.with_window(Duration::from_millis(50))?;
    let k = key("k-takeover");
    request(&mut client, &scope, &k).await?;
    keys_expired(&client, &scope).await?;
    // After the window the same key is a new request with new effects; the first request's
    // effects, not fanned out yet, stay on the row beside them.
    let second = request(&mut client, &scope, &k).await?;
    assert_eq!(second.status, 201);
    assert_eq!(count(&client, "orders").await?, 2);
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 4);

    let mut keys = fan_out(&db, 4).await?;
    keys.dedup();
    assert_eq!(keys.len(), 4, "two claims, two keys each");
    Ok(())
}

/// One request of key `k` at `level` with a deferred effect `{"req": n}` (none when `n` is
/// `None`), stored with [`Claim::complete`] and committed; returns the effect's downstream key.
async fn request_at(
    client: &mut tokio_postgres::Client,
    level: IsolationLevel,
    k: &IdempotencyKey,
    n: Option<i64>,
) -> anyhow::Result<Option<String>> {
    let scope = deferred()?;
    let tx = client
        .build_transaction()
        .isolation_level(level)
        .start()
        .await?;
    let mut claim = new_claim(&tx, &scope, k, &fingerprint(1)).await?;
    let downstream = n.map(|_| claim.downstream_key("charge"));
    if let Some(n) = n {
        claim.enqueue(
            "charge",
            OutboxMessage::new("stripe", &serde_json::json!({ "req": n }))?,
        )?;
    }
    claim.complete(&tx, &created(n.unwrap_or(0))).await?;
    tx.commit().await?;
    Ok(downstream)
}

/// Ends the window of every key, as if it had passed with no relay running.
async fn expire_keys(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    client
        .execute(
            "UPDATE txoutbox_idempotency_keys SET expires_at = now() - interval '1 second'",
            &[],
        )
        .await?;
    Ok(())
}

/// Takes over, at every isolation level, a key whose effects are still on its row with a
/// request that enqueues `second` (or nothing), runs a relay, and returns the downstream keys
/// expected (each effect's own claim's) and delivered.
async fn take_over_at_every_level(
    second: Option<i64>,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let (db, mut client) = db_with_orders().await?;
    let levels = [
        IsolationLevel::ReadCommitted,
        IsolationLevel::RepeatableRead,
        IsolationLevel::Serializable,
    ];
    let mut expected = Vec::new();
    for (i, level) in levels.into_iter().enumerate() {
        let k = key(&format!("k-take-over-{i}"));
        expected.extend(request_at(&mut client, IsolationLevel::ReadCommitted, &k, Some(1)).await?);
        expire_keys(&client).await?;
        expected.extend(request_at(&mut client, level, &k, second).await?);
    }
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(relay(&db, &sink)?);
    assert_eq!(
        sink.wait_for(expected.len(), Duration::from_secs(10)).await,
        expected.len(),
        "deliveries before the relay stopped"
    );
    relay.stop().await?;
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 0);
    expected.sort();
    let mut delivered = sink.keys();
    delivered.sort();
    Ok((expected, delivered))
}

#[tokio::test]
async fn a_take_over_at_any_isolation_level_delivers_both_requests_effects_with_their_keys(
) -> TestResult {
    let (expected, delivered) = take_over_at_every_level(Some(2)).await?;
    assert_eq!(expected.len(), 6, "two effects a level");
    assert_eq!(delivered, expected);
    Ok(())
}

#[tokio::test]
async fn a_take_over_without_effects_at_any_isolation_level_keeps_the_first_requests_effects(
) -> TestResult {
    let (expected, delivered) = take_over_at_every_level(None).await?;
    assert_eq!(expected.len(), 3, "the first request's effect, a level");
    assert_eq!(delivered, expected);
    Ok(())
}

#[tokio::test]
async fn a_key_whose_effects_are_poisoned_does_not_hold_the_others_back() -> TestResult {
    let (db, mut client) = db_with_orders().await?;
    // Oldest first: keys edited by hand into something that is not a list of effects.
    client
        .batch_execute(
            "INSERT INTO txoutbox_idempotency_keys (scope, key, fingerprint, state, \
                 response_status, response_headers, response_body, created_at, expires_at, \
                 effects) VALUES \
             ('charges', 'poisoned-not-a-list', '\\x00', 'completed', 201, '[]', '', \
                 now() - interval '1 hour', now() + interval '1 day', '\"not a list\"'), \
             ('charges', 'poisoned-no-destination', '\\x00', 'completed', 201, '[]', '', \
                 now() - interval '1 hour', now() + interval '1 day', \
                 '[{\"id\": \"00000000-0000-7000-8000-000000000001\", \"payload\": {}, \
                   \"downstream_key\": \"x\"}]')",
        )
        .await?;
    request(&mut client, &deferred()?, &key("k-healthy")).await?;

    fan_out(&db, 2).await?;
    assert_eq!(
        keys_with_effects(&client).await?.len(),
        2,
        "the poisoned keys keep their effects for an operator"
    );
    Ok(())
}

#[tokio::test]
async fn ordered_and_self_keyed_effects_are_written_at_once_in_a_deferred_scope() -> TestResult {
    let (_db, mut client) = db_with_orders().await?;
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, &deferred()?, &key("k-mixed"), &fingerprint(1)).await?;
    claim.enqueue(
        "ordered",
        OutboxMessage::new("stripe", &1)?.with_ordering_key("customer-7"),
    )?;
    claim.enqueue(
        "own-key",
        OutboxMessage::new("email", &2)?.with_downstream_key("digest:2026-12-06"),
    )?;
    claim.enqueue("deferred", OutboxMessage::new("email", &3)?)?;
    let enqueued = claim.complete(&tx, &created(1)).await?;
    tx.commit().await?;
    assert_eq!(enqueued.written().len(), 3);
    assert_eq!(count(&client, "txoutbox_messages").await?, 2);
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 1);
    Ok(())
}

#[tokio::test]
async fn commit_stores_the_key_and_commits_with_a_deadpool_transaction() -> TestResult {
    let (db, client) = db_with_orders().await?;
    let pool = db.pool(2)?;
    let scope = Scope::new("charges")?;
    for round in 0..3 {
        // The same pooled connection each round: its statement cache is reused, and a
        // transaction ended by `commit` leaves the connection usable.
        let mut conn = pool.get().await?;
        let tx = conn.transaction().await?;
        let k = key(&format!("k-pool-{round}"));
        let mut claim = new_claim(&tx, &scope, &k, &fingerprint(1)).await?;
        tx.execute("INSERT INTO orders (note) VALUES ('pooled')", &[])
            .await?;
        claim.enqueue("receipt", OutboxMessage::new("email", &round)?)?;
        claim.commit(tx, &created(round)).await?;
        // The connection is back outside any transaction: what it writes now is seen at once.
        conn.execute("INSERT INTO orders (note) VALUES ('after')", &[])
            .await?;
        let after = "SELECT count(*) FROM orders WHERE note = 'after'";
        assert_eq!(count(&client, after).await?, round + 1);
    }
    assert_eq!(count(&client, "orders").await?, 6);
    assert_eq!(count(&client, "txoutbox_messages").await?, 3);
    assert_eq!(count(&client, "txoutbox_idempotency_keys").await?, 3);
    Ok(())
}

#[tokio::test]
async fn a_key_stored_first_by_a_request_without_the_lock_is_a_409_and_commits_nothing(
) -> TestResult {
    // A request of a txoutbox before V5 claims the key by inserting its row, without the lock.
    let (db, mut client) = db_with_orders().await?;
    let scope = deferred()?;
    let k = key("k-rolling-upgrade");
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, &scope, &k, &fingerprint(1)).await?;
    let id = order(&tx, &mut claim, &k).await?;
    store_key_without_the_lock(&db.connect().await?, &k).await?;
    let err = claim
        .commit(tx, &created(id))
        .await
        .expect_err("the key is taken");
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    assert_eq!(err.http_status(), 409);
    assert_eq!(count(&client, "orders").await?, 0);
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 0);
    Ok(())
}

#[tokio::test]
async fn waiting_for_the_key_past_the_lock_timeout_is_in_flight() -> TestResult {
    let (db, mut first) = db_with_orders().await?;
    let scope = deferred()?.with_lock_timeout(Duration::from_millis(100))?;
    let k = key("k-held");
    let holder = first.transaction().await?;
    let _claim = new_claim(&holder, &scope, &k, &fingerprint(1)).await?;
    let mut second = db.connect().await?;
    let tx = second.transaction().await?;
    assert!(matches!(
        begin(&tx, &scope, &k, &fingerprint(1)).await?,
        Begin::InFlight
    ));
    Ok(())
}

#[tokio::test]
async fn effects_deferred_while_a_relay_runs_are_fanned_out_and_delivered() -> TestResult {
    let (db, mut client) = db_with_orders().await?;
    let Watched {
        sink,
        mut events,
        relay,
    } = watched(&db)?;
    // The relay has started and found nothing; the requests come later, with no hint.
    events.wait_for(|e| *e == RelayEvent::Idle).await?;
    let scope = deferred()?;
    for n in 0..5 {
        request(&mut client, &scope, &key(&format!("k-live-{n}"))).await?;
    }
    assert_eq!(sink.wait_for(10, Duration::from_secs(10)).await, 10);
    relay.stop().await?;
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_request_with_more_effects_than_a_key_row_carries_writes_them_as_rows() -> TestResult {
    use txoutbox::idempotency::MAX_DEFERRED_EFFECTS;
    let (_db, mut client) = db_with_orders().await?;
    for (n, effects) in [(1, MAX_DEFERRED_EFFECTS), (2, MAX_DEFERRED_EFFECTS + 1)] {
        let tx = client.transaction().await?;
        let k = key(&format!("k-many-{n}"));
        let mut claim = new_claim(&tx, &deferred()?, &k, &fingerprint(n)).await?;
        for i in 0..effects {
            claim.enqueue(&format!("effect-{i}"), OutboxMessage::new("email", &i)?)?;
        }
        claim.commit(tx, &created(n)).await?;
    }
    // The first request's effects ride on its key row; the second's are rows at once.
    assert_eq!(
        count(&client, EFFECTS_ON_KEYS).await?,
        MAX_DEFERRED_EFFECTS as i64
    );
    assert_eq!(
        count(&client, "txoutbox_messages").await?,
        MAX_DEFERRED_EFFECTS as i64 + 1
    );
    Ok(())
}

#[tokio::test]
async fn a_postgres_crash_while_effects_are_fanned_out_loses_no_effect() -> TestResult {
    use txoutbox_test_support::drain_across_a_restart;
    use txoutbox_test_support::request::create_orders;
    use txoutbox_test_support::Cluster;
    let (cluster, db) = Cluster::private_with_db().await?;
    let mut client = db.connect().await?;
    create_orders(&client).await?;
    let scope = deferred()?;
    for n in 0..1_500 {
        request(&mut client, &scope, &key(&format!("k-crash-{n}"))).await?;
    }
    drop(client);
    // Mid-drain, with fan-outs committed without waiting for their flush: an immediate stop,
    // as a crash.
    let drained = drain_across_a_restart(&cluster, &db, &["stripe", "email"], 3_000).await?;
    let client = db.connect().await?;
    assert_eq!(
        drained.delivered, 3_000,
        "every effect delivered after the crash"
    );
    assert_eq!(count(&client, EFFECTS_ON_KEYS).await?, 0);
    assert_eq!(
        drained.distinct_keys, 3_000,
        "at least once: every key reached the sink"
    );
    Ok(())
}
