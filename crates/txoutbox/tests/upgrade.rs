//! Schema upgrades over live data: a schema of an older version, filled with rows in every state,
//! migrated to this build's, keeps every row and every attempt; and V4's split of the attempt
//! history (a delivered row carries its delivering attempt; the log keeps the rest) reads as one
//! history through `txoutbox_attempts`.

use std::time::Duration;

use txoutbox::admin::MessageStatus;
use txoutbox::admin::{self, PurgeOptions, ReplayOptions, ReplaySelection, Retention};
use txoutbox_test_support::relay::{RecordingSink, RunningRelay};
use txoutbox_test_support::request::empty_created;
use txoutbox_test_support::select::{value, value_with};
use txoutbox_test_support::{
    count, counts, drop_schema, status, test_db_with_client, wait_until, TestDb,
};
use uuid::Uuid;

type TestResult = anyhow::Result<()>;

/// A database of this test's own, migrated up to `version` only.
async fn schema_at(version: i32) -> anyhow::Result<(TestDb, tokio_postgres::Client)> {
    let (db, mut client) = test_db_with_client().await?;
    drop_schema(&client).await?;
    let applied = admin::migrate_to(&mut client, version).await?;
    assert_eq!(applied, (1..=version).collect::<Vec<_>>());
    Ok((db, client))
}

/// The versions of this build's migrations after `version`: what migrating a schema at
/// `version` applies (the numbering may have gaps).
fn after(version: i32) -> Vec<i32> {
    admin::embedded_migrations()
        .into_iter()
        .map(|(v, _, _)| v)
        .filter(|v| *v > version)
        .collect()
}

/// Every attempt `txoutbox_attempts` shows, in a stable order, as text.
async fn all_attempts(client: &tokio_postgres::Client) -> anyhow::Result<Vec<String>> {
    attempts_as(client, "destination").await
}

/// [`all_attempts`] with `last` as the last column (V1's log has no destination).
async fn attempts_as(client: &tokio_postgres::Client, last: &str) -> anyhow::Result<Vec<String>> {
    Ok(client
        .query(
            &format!(
                "SELECT concat_ws('|', message_id, attempt, downstream_key, relay, lease_token, \
                     outcome, error, receipt, started_at, finished_at, {last}) \
                 FROM txoutbox_attempts ORDER BY 1"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Rows in every state, written as a V3 relay and operator wrote them.
const V3_ROWS: &str = "\
INSERT INTO txoutbox_idempotency_keys (scope, key, fingerprint, state, response_status, \
    response_headers, response_body, expires_at) \
VALUES ('charges', 'k-1', '\\x00', 'completed', 201, '[]', 'ok', now() + interval '1 day'), \
       ('charges', 'k-2', '\\x01', 'in_flight', NULL, NULL, NULL, now() + interval '1 day');
INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, status, attempts, \
    lease_owner, lease_expires_at, lease_token, attempt_started_at, last_error) VALUES \
 ('00000000-0000-7000-8000-000000000001', 'email', '{}', 'pending-1', 'pending', 0, \
    NULL, NULL, NULL, NULL, NULL), \
 ('00000000-0000-7000-8000-000000000002', 'email', '{}', 'leased-1', 'in_flight', 1, \
    'relay-old', now() - interval '1 minute', nextval('txoutbox_lease_token_seq'), \
    now() - interval '2 minutes', NULL), \
 ('00000000-0000-7000-8000-000000000003', 'email', '{}', 'failed-1', 'failed', 3, \
    NULL, NULL, NULL, now() - interval '1 hour', 'boom'), \
 ('00000000-0000-7000-8000-000000000004', 'stripe', '{}', 'unknown-1', 'unknown', 1, \
    NULL, NULL, NULL, now() - interval '1 hour', 'lost');
INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, downstream_key, \
    attempts, created_at, delivered_at, receipt) VALUES \
 ('00000000-0000-7000-8000-000000000005', 100, 'email', '{}', '{}', 'delivered-1', 2, \
    now() - interval '2 hours', now() - interval '1 hour', '250 ok');
INSERT INTO txoutbox_discarded (id, seq, destination, payload, headers, downstream_key, \
    attempts, discarded_from, last_error, reason, created_at) VALUES \
 ('00000000-0000-7000-8000-000000000006', 101, 'email', '{}', '{}', 'discarded-1', 1, \
    'failed', 'bad', 'test data', now() - interval '3 hours');
INSERT INTO txoutbox_destinations (destination, paused_at, paused_by, paused_reason) \
VALUES ('stripe', now(), 'ops', 'maintenance');
INSERT INTO txoutbox_attempts (message_id, destination, attempt, downstream_key, relay, \
    lease_token, outcome, error, receipt, started_at, finished_at) VALUES \
 ('00000000-0000-7000-8000-000000000003', 'email', 3, 'failed-1', 'relay-old', 7, 'failed', \
    'boom', NULL, now() - interval '1 hour', now() - interval '1 hour'), \
 ('00000000-0000-7000-8000-000000000004', 'stripe', 1, 'unknown-1', 'relay-old', 8, 'unknown', \
    'lost', NULL, now() - interval '1 hour', now() - interval '1 hour'), \
 ('00000000-0000-7000-8000-000000000005', 'email', 1, 'delivered-1', 'relay-old', 5, 'retry', \
    '421 busy', NULL, now() - interval '90 minutes', now() - interval '90 minutes'), \
 ('00000000-0000-7000-8000-000000000005', 'email', 2, 'delivered-1', 'relay-old', 6, \
    'delivered', NULL, '250 ok', now() - interval '61 minutes', now() - interval '1 hour'), \
 ('00000000-0000-7000-8000-000000000006', 'email', 0, 'discarded-1', 'operator', NULL, \
    'discarded', 'test data', NULL, now() - interval '1 hour', now() - interval '1 hour'), \
 (NULL, 'stripe', 0, '', 'operator', NULL, 'paused', 'maintenance', NULL, now(), now());";

#[tokio::test]
async fn an_upgrade_from_v3_keeps_every_row_and_every_attempt() -> TestResult {
    let (_db, mut client) = schema_at(3).await?;
    client.batch_execute(V3_ROWS).await?;
    let rows_before = (
        counts(&client).await?,
        count(&client, "txoutbox_destinations").await?,
    );
    let statuses = "SELECT string_agg(status || ':' || attempts || ':' || \
         COALESCE(lease_owner, '-'), ',' ORDER BY id) FROM txoutbox_messages";
    let hot_before: String = value(&client, statuses).await?;
    let attempts_before = all_attempts(&client).await?;
    assert_eq!(attempts_before.len(), 6);

    let applied = txoutbox::migrate(&mut client).await?;
    assert_eq!(applied, after(3));

    let rows_after = (
        counts(&client).await?,
        count(&client, "txoutbox_destinations").await?,
    );
    assert_eq!(rows_after, rows_before, "every row of every table is kept");
    let hot_after: String = value(&client, statuses).await?;
    assert_eq!(hot_after, hot_before, "hot rows keep their state and lease");
    assert_eq!(
        all_attempts(&client).await?,
        attempts_before,
        "the view shows exactly the attempts the V3 table held"
    );
    assert_eq!(
        carried_attempts(&client).await?,
        Vec::<String>::new(),
        "a row delivered before V4 keeps its attempt in the log, not twice"
    );
    let outcomes = outcomes_of(&client, id(5)).await?;
    assert_eq!(outcomes, ["retry", "delivered"]);
    Ok(())
}

#[tokio::test]
async fn an_upgrade_from_v1_keeps_every_row_and_every_attempt() -> TestResult {
    let (_db, mut client) = schema_at(1).await?;
    // V1 has no discarded table, no destinations, no destination column in the log.
    client
        .batch_execute(
            "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, status, \
                 attempts, last_error) VALUES \
             ('00000000-0000-7000-8000-000000000001', 'email', '{}', 'p-1', 'pending', 0, NULL), \
             ('00000000-0000-7000-8000-000000000003', 'email', '{}', 'f-1', 'failed', 2, 'boom'); \
             INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, \
                 downstream_key, attempts, created_at, delivered_at, receipt) VALUES \
             ('00000000-0000-7000-8000-000000000005', 100, 'email', '{}', '{}', 'd-1', 1, \
                 now(), now(), '250 ok'); \
             INSERT INTO txoutbox_attempts (message_id, attempt, downstream_key, relay, \
                 lease_token, outcome, error, receipt, started_at, finished_at) VALUES \
             ('00000000-0000-7000-8000-000000000003', 2, 'f-1', 'relay-old', 3, 'failed', \
                 'boom', NULL, now(), now()), \
             ('00000000-0000-7000-8000-000000000005', 1, 'd-1', 'relay-old', 4, 'delivered', \
                 NULL, '250 ok', now(), now())",
        )
        .await?;
    let before = attempts_as(&client, "NULL").await?;
    assert_eq!(txoutbox::migrate(&mut client).await?, after(1));
    assert_eq!(attempts_as(&client, "destination").await?, before);
    assert_eq!(counts(&client).await?.hot(), 2);
    let shown = admin::show_message(&client, id(5)).await?;
    assert_eq!(shown.history.len(), 1);
    assert_eq!(shown.history[0].receipt.as_deref(), Some("250 ok"));
    Ok(())
}

/// The outcomes of the history `txoutbox show` gives for message `id`, oldest first.
async fn outcomes_of(client: &tokio_postgres::Client, id: Uuid) -> anyhow::Result<Vec<String>> {
    Ok(admin::show_message(client, id)
        .await?
        .history
        .iter()
        .map(|a| a.outcome.to_string())
        .collect())
}

/// The downstream keys of the delivered rows that carry their delivering attempt (V4 on), in
/// order.
async fn carried_attempts(client: &tokio_postgres::Client) -> anyhow::Result<Vec<String>> {
    keys_of(
        client,
        "SELECT downstream_key FROM txoutbox_delivered WHERE relay IS NOT NULL ORDER BY 1",
    )
    .await
}

/// The first column of every row `sql` returns.
async fn keys_of(client: &tokio_postgres::Client, sql: &str) -> anyhow::Result<Vec<String>> {
    Ok(client
        .query(sql, &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// How many attempts `txoutbox show` lists for message `id`.
async fn history_len(client: &tokio_postgres::Client, id: Uuid) -> anyhow::Result<usize> {
    Ok(admin::show_message(client, id).await?.history.len())
}

fn id(n: u128) -> Uuid {
    Uuid::from_u128(0x0000_0000_0000_7000_8000_0000_0000_0000 | n)
}

#[tokio::test]
async fn after_the_upgrade_a_delivery_writes_no_log_row_and_the_history_stays_whole() -> TestResult
{
    let (db, mut client) = schema_at(3).await?;
    client.batch_execute(V3_ROWS).await?;
    txoutbox::migrate(&mut client).await?;
    let log_before = count(&client, "txoutbox_attempt_log").await?;

    // The pending row and the row whose V3 lease has expired are delivered by a V4 relay.
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("email", sink.clone()).build()?);
    // One row was delivered under V3; two more now.
    let delivered = wait_until(&client, |c| c.delivered >= 3).await?.delivered;
    relay.stop().await?;
    assert_eq!(delivered, 3);
    assert_eq!(carried_attempts(&client).await?, ["leased-1", "pending-1"]);
    let logged = keys_of(
        &client,
        "SELECT downstream_key FROM txoutbox_attempt_log WHERE outcome = 'delivered'",
    )
    .await?;
    assert_eq!(
        logged,
        ["delivered-1"],
        "only the V3 delivery is in the log"
    );
    // The expired V3 lease is logged (`expired`); the deliveries are carried by their rows.
    let new_log_rows = count(&client, "txoutbox_attempt_log").await?;
    assert_eq!(new_log_rows, log_before + 1);

    for (n, key) in [(1, "pending-1"), (2, "leased-1")] {
        let shown = admin::show_message(&client, id(n)).await?;
        let last = shown.history.last().expect("an attempt");
        assert_eq!(last.outcome.to_string(), "delivered", "{key}");
        assert_eq!(last.downstream_key, key);
        assert_eq!(last.attempt, shown.message.attempts);
        assert!(last.lease_token.is_some());
        assert!(last.started_at <= last.finished_at);
        assert_ne!(last.relay, "operator");
    }
    let outcomes = outcomes_of(&client, id(2)).await?;
    assert_eq!(outcomes, ["expired", "delivered"]);

    // A replay of a delivered row moves its carried attempt into the log first.
    let report = admin::replay(
        &mut client,
        &ReplaySelection::Ids(vec![id(1)]),
        &ReplayOptions {
            include_delivered: true,
            ..ReplayOptions::default()
        },
        None,
    )
    .await?;
    assert_eq!(report.replayed.len(), 1);
    let outcomes = outcomes_of(&client, id(1)).await?;
    assert_eq!(outcomes, ["delivered", "replayed"]);
    Ok(())
}

#[tokio::test]
async fn writes_through_the_attempts_view_reach_the_row_that_holds_the_attempt() -> TestResult {
    let (_db, client) = schema_at(4).await?;
    client.batch_execute(V3_ROWS).await?;
    // A delivered row carrying its attempt, as a V4 relay writes it.
    client
        .batch_execute(
            "INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, \
                 downstream_key, attempts, created_at, delivered_at, receipt, relay, lease_token, \
                 attempt_started_at) VALUES \
             ('00000000-0000-7000-8000-000000000007', 102, 'email', '{}', '{}', 'carried-1', 1, \
                 now() - interval '2 days', now() - interval '2 days', '250 ok', 'relay-1', 9, \
                 now() - interval '2 days')",
        )
        .await?;
    // `show` reads the history through the view.
    assert_eq!(history_len(&client, id(7)).await?, 1);
    // INSERT: logged, with the view's default end time.
    client
        .execute(
            "INSERT INTO txoutbox_attempts (message_id, attempt, downstream_key, relay, outcome, \
                 started_at) VALUES ($1, 0, 'carried-1', 'operator', 'replayed', now())",
            &[&id(7)],
        )
        .await?;
    assert_eq!(history_len(&client, id(7)).await?, 2);
    // UPDATE of the carried attempt changes the delivered row; of a log row, that row.
    let moved = client
        .execute(
            "UPDATE txoutbox_attempts SET started_at = started_at - interval '1 day', \
                 finished_at = finished_at - interval '1 day' WHERE message_id = $1",
            &[&id(7)],
        )
        .await?;
    assert_eq!(moved, 2);
    let carried_start: bool = value_with(
        &client,
        "SELECT attempt_started_at < now() - interval '2 days 23 hours' \
             FROM txoutbox_delivered WHERE id = $1",
        &[&id(7)],
    )
    .await?;
    assert!(carried_start);
    let logged_start: bool = value_with(
        &client,
        "SELECT started_at < now() - interval '23 hours' FROM txoutbox_attempt_log \
             WHERE message_id = $1",
        &[&id(7)],
    )
    .await?;
    assert!(logged_start);
    // DELETE of the carried attempt keeps the delivered row, without its attempt.
    let deleted = client
        .execute(
            "DELETE FROM txoutbox_attempts WHERE message_id = $1 AND outcome = 'delivered'",
            &[&id(7)],
        )
        .await?;
    assert_eq!(deleted, 1);
    assert_eq!(history_len(&client, id(7)).await?, 1);
    assert_eq!(
        status(&client, "carried-1").await?,
        Some(MessageStatus::Delivered)
    );
    Ok(())
}

#[tokio::test]
async fn a_purge_counts_and_deletes_the_attempts_delivered_rows_carry() -> TestResult {
    let (_db, client) = schema_at(4).await?;
    client
        .batch_execute(
            "INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, \
                 downstream_key, attempts, created_at, delivered_at, receipt, relay, lease_token, \
                 attempt_started_at) \
             SELECT gen_random_uuid(), g, 'email', '{}', '{}', 'old-' || g, 1, \
                 now() - interval '30 days', now() - interval '30 days', NULL, 'relay-1', g, \
                 now() - interval '30 days' FROM generate_series(1, 5) g; \
             INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, \
                 relay, outcome, error, started_at, finished_at) \
             SELECT id, 'email', 0, downstream_key, 'relay-1', 'retry', 'busy', \
                 now() - interval '31 days', now() - interval '31 days' \
             FROM txoutbox_delivered WHERE seq <= 2",
        )
        .await?;
    let options = |dry_run| PurgeOptions {
        retention: Retention::default(),
        batch: 2,
        expired_keys: false,
        dry_run,
    };
    let planned = admin::purge(&client, &options(true), None).await?;
    assert_eq!((planned.delivered, planned.attempts), (5, 7));
    let done = admin::purge(&client, &options(false), None).await?;
    assert_eq!((done.delivered, done.attempts), (5, 7));
    assert_eq!(counts(&client).await?.attempts, 0);
    Ok(())
}

#[tokio::test]
async fn an_upgrade_from_v4_answers_its_keys_and_delivers_its_rows_and_new_deferred_effects(
) -> TestResult {
    let (db, mut client) = schema_at(4).await?;
    client.batch_execute(V3_ROWS).await?;
    let rows_before = counts(&client).await?;
    assert_eq!(txoutbox::migrate(&mut client).await?, after(4));
    assert_eq!(counts(&client).await?, rows_before);
    assert_eq!(
        keys_of(
            &client,
            "SELECT key FROM txoutbox_idempotency_keys WHERE effects IS NOT NULL"
        )
        .await?,
        Vec::<String>::new(),
        "keys stored before V5 carry no effects"
    );

    // The keys V4 stored answer as before: a completed one is replayed, one committed without
    // a response is held.
    let fingerprint = txoutbox::Fingerprint::new("POST", "/charge", b"{}");
    let stored: &[u8] = fingerprint.as_bytes();
    client
        .execute(
            "INSERT INTO txoutbox_idempotency_keys (scope, key, fingerprint, state, \
                 response_status, response_headers, response_body, expires_at) VALUES \
             ('charges', 'v4-completed-key', $1, 'completed', 201, '[]', 'from v4', \
                 now() + interval '1 day'), \
             ('charges', 'v4-held-key-0000', $1, 'in_flight', NULL, NULL, NULL, \
                 now() + interval '1 day')",
            &[&stored],
        )
        .await?;
    let scope = txoutbox::Scope::new("charges")?;
    let answer = |key: &'static str| {
        let (scope, db) = (scope.clone(), &db);
        async move {
            let mut client = db.connect().await?;
            let tx = client.transaction().await?;
            let key = txoutbox::IdempotencyKey::parse(key)?;
            anyhow::Ok(txoutbox::begin(&tx, &scope, &key, &fingerprint).await?)
        }
    };
    match answer("v4-completed-key").await? {
        txoutbox::Begin::Replay(stored) => assert_eq!(stored.body, b"from v4"),
        other => panic!("a replay, not {other:?}"),
    }
    assert!(matches!(
        answer("v4-held-key-0000").await?,
        txoutbox::Begin::InFlight
    ));

    // A V5 request with deferred effects, and the V4 rows, are all delivered.
    let deferred = txoutbox::Scope::new("charges")?.with_deferred_effects();
    let tx = client.transaction().await?;
    let key = txoutbox::IdempotencyKey::parse("a-new-key-after-v5")?;
    let txoutbox::Begin::New(mut claim) =
        txoutbox::begin(&tx, &deferred, &key, &fingerprint).await?
    else {
        panic!("a new key");
    };
    claim.enqueue("receipt", txoutbox::OutboxMessage::new("email", &1)?)?;
    let response = empty_created();
    claim.commit(tx, &response).await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("email", sink.clone()).build()?);
    // The pending V4 row, the one whose V4 lease expired, and the new request's effect.
    assert_eq!(sink.wait_for(3, Duration::from_secs(20)).await, 3);
    relay.stop().await?;
    let keys = sink.keys();
    assert!(keys.contains(&"pending-1".to_owned()), "{keys:?}");
    assert!(keys.contains(&"leased-1".to_owned()), "{keys:?}");
    assert!(keys.contains(&claim_key_of(&client, "a-new-key-after-v5").await?));
    Ok(())
}

/// The downstream key of the `receipt` effect of the request with `key`, from its delivery.
async fn claim_key_of(client: &tokio_postgres::Client, key: &str) -> anyhow::Result<String> {
    let row = client
        .query_one(
            "SELECT downstream_key FROM txoutbox_delivered d JOIN txoutbox_idempotency_keys k \
             ON d.created_at = k.created_at WHERE k.key = $1",
            &[&key],
        )
        .await?;
    Ok(row.get(0))
}
