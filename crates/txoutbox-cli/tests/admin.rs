//! The operator's commands (`list`, `show`, `replay`, `purge`, `stats`) run as a user runs them:
//! the `txoutbox` binary against a database of each test's own, with rows put in their states by
//! the real relay.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_postgres::Client;
use txoutbox::admin::{
    AttemptOutcome,
    MessageStatus::{Delivered, Discarded, Failed, Pending, Unknown},
};
use txoutbox::{
    relay::{DestinationPolicy, RelayConfig, Semantics},
    sink::{Delivery, DeliveryError, Receipt, Sink},
};
use txoutbox_test_support::factory::{pending, pending_many, pending_ordered};
use txoutbox_test_support::process::succeeded;
use txoutbox_test_support::relay::{
    quick_retry, relay_config, RecordingSink, RunningRelay, ScriptedSink,
};
use txoutbox_test_support::request::empty_created;
use txoutbox_test_support::{
    attempts_of, counts, downstream_key_of, eventually_some, log_of, logged, row_status, test_db,
    test_db_with_client, test_db_with_sql, wait_for_row, wait_until, wait_until_for, TestDb,
};
use uuid::Uuid;

mod support;
use support::{ok, txoutbox};
use txoutbox_test_support::select::{column, value_with};

type TestResult = anyhow::Result<()>;

/// The stderr of a failed command, checked to be exactly one line, with the exit code.
fn one_line_error(out: &Output) -> (Option<i32>, String) {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    (out.status.code(), err)
}

fn json_lines(stdout: &str) -> anyhow::Result<Vec<Value>> {
    Ok(stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

fn ids_of(rows: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = rows
        .iter()
        .map(|r| r["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[Uuid]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    ids.sort();
    ids
}

/// Fails unless `txoutbox list --json ARGS` lists exactly the rows `expected`.
async fn assert_lists(db: &TestDb, args: &[&str], expected: &[Uuid]) -> TestResult {
    let mut all = vec!["list", "--json"];
    all.extend_from_slice(args);
    let listed = ids_of(&json_lines(&ok(db, &all).await?)?);
    assert_eq!(listed, sorted(expected), "list {args:?}");
    Ok(())
}

/// Delivers every pending row of `destination` with a real relay.
async fn deliver(db: &TestDb, client: &Client, destination: &str) -> anyhow::Result<RecordingSink> {
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink(destination, sink.clone()).build()?);
    wait_until_for(client, destination, |c| c.hot() == 0).await?;
    relay.stop().await?;
    Ok(sink)
}

/// Dead-letters every pending row of `destination` (`n` of them) with a real relay whose sink
/// answers a permanent error.
async fn dead_letter(db: &TestDb, client: &Client, destination: &str, n: usize) -> TestResult {
    let sink = ScriptedSink::new(
        (0..n).map(|_| Err(DeliveryError::permanent("422 rejected by the downstream"))),
    );
    let relay = RunningRelay::start(db.relay()?.sink(destination, sink).build()?);
    wait_until_for(client, destination, |c| c.failed == n as i64).await?;
    relay.stop().await?;
    Ok(())
}

/// A row of `destination` with downstream key `key`, dead-lettered by a real relay; its id.
async fn dead_lettered(
    db: &TestDb,
    client: &mut Client,
    destination: &str,
    key: &str,
) -> anyhow::Result<Uuid> {
    let id = pending(&mut *client, destination, key).await?;
    dead_letter(db, client, destination, 1).await?;
    Ok(id)
}

/// A row of `destination` with downstream key `key`, delivered by a real relay; its id.
async fn delivered_row(
    db: &TestDb,
    client: &mut Client,
    destination: &str,
    key: &str,
) -> anyhow::Result<Uuid> {
    let id = pending(&mut *client, destination, key).await?;
    deliver(db, client, destination).await?;
    Ok(id)
}

/// One row in each of three states, put there by real relays: `f-1` failed (destination
/// `doomed`), then `d-1` delivered, then `p-1` pending (destination `email`); their ids.
async fn failed_delivered_pending(db: &TestDb, client: &mut Client) -> anyhow::Result<[Uuid; 3]> {
    let failed = dead_lettered(db, client, "doomed", "f-1").await?;
    let delivered = delivered_row(db, client, "email", "d-1").await?;
    let pending = pending(&mut *client, "email", "p-1").await?;
    Ok([failed, delivered, pending])
}

/// A downstream that never answers: its rows stay in flight under the relay's lease.
#[derive(Clone, Default)]
struct HangingSink {
    calls: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Sink for HangingSink {
    async fn deliver(&self, _: &Delivery) -> Result<Receipt, DeliveryError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

/// The test timings, under the name `owner`, with a short shutdown grace.
fn relay_named(owner: &str) -> RelayConfig {
    relay_config()
        .with_owner(owner)
        .with_shutdown_grace(Duration::from_millis(100))
}

/// Makes the pending rows of `destination` `unknown` the relay's way: an at-most-once attempt cut
/// short at shutdown.
async fn make_unknown(db: &TestDb, client: &Client, destination: &str, n: i64) -> TestResult {
    let relay = RunningRelay::start(
        db.relay()?
            .config(relay_named("amo-relay"))
            .sink(destination, HangingSink::default())
            .policy(
                destination,
                DestinationPolicy {
                    semantics: Semantics::AtMostOnce,
                    ..DestinationPolicy::default()
                },
            )
            .build()?,
    );
    wait_until(client, |c| c.in_flight == n).await?;
    relay.stop().await?;
    wait_until_for(client, destination, |c| c.unknown == n).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// list

#[tokio::test]
async fn list_shows_every_state_in_an_aligned_table() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let [failed, delivered, pending] = failed_delivered_pending(&db, &mut client).await?;

    let out = ok(&db, &["list"]).await?;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[0].starts_with("ID"), "{out}");
    let status_col = lines[0].find("STATUS").expect("a STATUS column");
    let key_col = lines[0].find("DOWNSTREAM KEY").expect("a key column");
    for (id, status, key) in [
        (pending, "pending", "p-1"),
        (delivered, "delivered", "d-1"),
        (failed, "failed", "f-1"),
    ] {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&id.to_string()))
            .unwrap_or_else(|| panic!("{id} listed: {out}"));
        assert_eq!(
            &line[status_col..status_col + status.len()],
            status,
            "{out}"
        );
        assert_eq!(&line[key_col..key_col + key.len()], key, "{out}");
    }
    assert!(out.contains("422 rejected by the downstream"), "{out}");
    // Newest first.
    assert!(lines[1].starts_with(&pending.to_string()), "{out}");
    Ok(())
}

#[tokio::test]
async fn list_json_is_one_object_per_line() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = pending_ordered(&mut client, "email", "j-1", "order-1").await?;
    pending(&mut client, "email", "j-2").await?;
    let rows = json_lines(&ok(&db, &["list", "--json"]).await?)?;
    assert_eq!(rows.len(), 2);
    let row = rows
        .iter()
        .find(|r| r["id"] == id.to_string())
        .expect("listed");
    assert_eq!(row["status"], "pending");
    assert_eq!(row["destination"], "email");
    assert_eq!(row["downstream_key"], "j-1");
    assert_eq!(row["ordering_key"], "order-1");
    assert_eq!(row["attempts"], 0);
    Ok(())
}

#[tokio::test]
async fn list_status_filter_selects_one_state() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let [failed, delivered, pending] = failed_delivered_pending(&db, &mut client).await?;
    assert_lists(&db, &["--status", "failed"], &[failed]).await?;
    assert_lists(&db, &["--status", "delivered"], &[delivered]).await?;
    assert_lists(&db, &["--status", "pending"], &[pending]).await?;
    assert_lists(&db, &["--status", "in-flight"], &[]).await?;
    assert_lists(&db, &["--status", "unknown"], &[]).await?;
    Ok(())
}

#[tokio::test]
async fn list_status_filter_finds_unknown_rows() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let sms = pending(&mut client, "sms", "s-1").await?;
    make_unknown(&db, &client, "sms", 1).await?;
    pending(&mut client, "email", "p-1").await?;
    assert_lists(&db, &["--status", "unknown"], &[sms]).await?;
    Ok(())
}

#[tokio::test]
async fn list_destination_filter_selects_one_destination() -> TestResult {
    let db = test_db().await?;
    let email = pending(&db, "email", "e-1").await?;
    pending(&db, "sms", "s-1").await?;
    assert_lists(&db, &["--destination", "email"], &[email]).await?;
    assert_lists(&db, &["--destination", "fax"], &[]).await?;
    Ok(())
}

#[tokio::test]
async fn list_since_and_until_take_durations_ago_and_rfc3339_times() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let old = pending(&mut client, "email", "old").await?;
    let new = pending(&mut client, "email", "new").await?;
    // Time passing: the old row was enqueued three hours ago.
    client
        .execute(
            "UPDATE txoutbox_messages SET created_at = now() - interval '3 hours' WHERE id = $1",
            &[&old],
        )
        .await?;
    assert_lists(&db, &["--since", "2h"], &[new]).await?;
    assert_lists(&db, &["--until", "2h"], &[old]).await?;
    assert_lists(&db, &["--since", "4h"], &[old, new]).await?;
    let at = |hours: i64| {
        (chrono::Utc::now() - chrono::Duration::hours(hours))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    assert_lists(&db, &["--since", &at(4), "--until", &at(1)], &[old]).await?;
    assert_lists(&db, &["--since", &at(1)], &[new]).await?;
    Ok(())
}

#[tokio::test]
async fn list_key_filter_selects_by_downstream_key() -> TestResult {
    let db = test_db().await?;
    let wanted = pending(&db, "email", "receipt-42").await?;
    pending(&db, "email", "receipt-43").await?;
    assert_lists(&db, &["--key", "receipt-42"], &[wanted]).await?;
    Ok(())
}

#[tokio::test]
async fn list_ordering_key_filter_selects_by_ordering_key() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let a = pending_ordered(&mut client, "email", "o-1", "order-7").await?;
    let b = pending_ordered(&mut client, "email", "o-2", "order-7").await?;
    pending_ordered(&mut client, "email", "o-3", "order-8").await?;
    pending(&mut client, "email", "o-4").await?;
    assert_lists(&db, &["--ordering-key", "order-7"], &[a, b]).await?;
    Ok(())
}

#[tokio::test]
async fn show_and_list_say_a_row_behind_its_keys_head_waits_for_the_row_ahead() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let head = pending_ordered(&mut client, "email", "w-1", "order-9").await?;
    let behind = pending_ordered(&mut client, "email", "w-2", "order-9").await?;
    let text = ok(&db, &["show", &behind.to_string()]).await?;
    let line = text.lines().find(|l| l.contains("next attempt"));
    assert!(
        line.is_some_and(|l| l.trim_end().ends_with("waits for the row ahead")),
        "{text}"
    );
    let text = ok(&db, &["show", &head.to_string()]).await?;
    assert!(text.contains("next attempt"), "{text}");
    assert!(!text.contains("waits for the row ahead"), "{text}");
    let detail: Value =
        serde_json::from_str(&ok(&db, &["show", &behind.to_string(), "--json"]).await?)?;
    assert_eq!(detail["waits_for_row_ahead"], true);
    assert!(detail["next_attempt_at"].is_null(), "{detail}");
    let rows = json_lines(&ok(&db, &["list", "--json"]).await?)?;
    let waits: Vec<(&str, &Value)> = rows
        .iter()
        .map(|r| {
            (
                r["downstream_key"].as_str().unwrap_or_default(),
                &r["waits_for_row_ahead"],
            )
        })
        .collect();
    assert_eq!(
        waits,
        [("w-2", &Value::Bool(true)), ("w-1", &Value::Bool(false))]
    );
    Ok(())
}

#[tokio::test]
async fn list_shows_50_rows_unless_told_and_newest_first() -> TestResult {
    let db = test_db().await?;
    let ids = pending_many(&db, "email", "k", 60).await?;
    let rows = json_lines(&ok(&db, &["list", "--json"]).await?)?;
    assert_eq!(rows.len(), 50);
    let rows = json_lines(&ok(&db, &["list", "--json", "--limit", "7"]).await?)?;
    assert_eq!(rows.len(), 7);
    assert_eq!(rows[0]["id"], ids[59].to_string());
    assert_eq!(rows[6]["id"], ids[53].to_string());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// show

#[tokio::test]
async fn show_prints_payload_key_and_the_attempt_history_in_order() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = pending(&mut client, "flaky", "fl-1").await?;
    let sink = ScriptedSink::new([
        Err(DeliveryError::retryable("timed out")),
        Err(DeliveryError::permanent("card declined")),
    ]);
    let relay = RunningRelay::start(
        db.relay()?
            .sink("flaky", sink)
            .policy("flaky", quick_retry(5))
            .build()?,
    );
    wait_until(&client, |c| c.failed == 1).await?;
    relay.stop().await?;

    let detail: Value =
        serde_json::from_str(&ok(&db, &["show", &id.to_string(), "--json"]).await?)?;
    assert_eq!(detail["id"], id.to_string());
    assert_eq!(detail["status"], "failed");
    assert_eq!(detail["downstream_key"], "fl-1");
    assert_eq!(detail["payload"], serde_json::json!({ "key": "fl-1" }));
    let history = detail["history"].as_array().expect("a history");
    let outcomes: Vec<&str> = history
        .iter()
        .filter_map(|a| a["outcome"].as_str())
        .collect();
    assert_eq!(outcomes, ["retry", "failed"]);
    assert_eq!(history[0]["attempt"], 1);
    assert_eq!(history[0]["error"], "timed out");
    assert_eq!(history[1]["attempt"], 2);
    assert_eq!(history[1]["error"], "card declined");

    let text = ok(&db, &["show", &id.to_string()]).await?;
    assert!(text.contains("fl-1"), "{text}");
    assert!(text.contains("\"key\": \"fl-1\""), "payload shown: {text}");
    let retry = text.find("timed out").expect("first attempt shown");
    let failed = text.rfind("card declined").expect("second attempt shown");
    assert!(retry < failed, "in order: {text}");
    Ok(())
}

#[tokio::test]
async fn show_of_an_unknown_id_exits_1_with_one_line() -> TestResult {
    let db = test_db().await?;
    let id = Uuid::now_v7();
    let out = txoutbox(&db, &["show", &id.to_string()]).await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains(&id.to_string()), "{err}");
    assert!(out.stdout.is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// replay

#[tokio::test]
async fn replay_keeps_the_downstream_key_and_a_relay_delivers_it_again() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = dead_lettered(&db, &mut client, "stripe", "charge-1").await?;

    let out = ok(&db, &["replay", &id.to_string()]).await?;
    assert!(out.starts_with("replayed 1 message\n"), "{out}");
    let row = client
        .query_one(
            "SELECT status, attempts, last_error, lease_owner, next_attempt_at <= now() \
             FROM txoutbox_messages WHERE id = $1",
            &[&id],
        )
        .await?;
    assert_eq!(row.get::<_, String>(0), "pending");
    assert_eq!(row.get::<_, i32>(1), 0);
    assert_eq!(row.get::<_, Option<String>>(2), None);
    assert_eq!(row.get::<_, Option<String>>(3), None);
    assert!(row.get::<_, bool>(4), "due now");

    let sink = deliver(&db, &client, "stripe").await?;
    let deliveries = sink.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].id, id);
    assert_eq!(deliveries[0].downstream_key, "charge-1");
    assert_eq!(deliveries[0].attempt, 1, "a fresh attempt budget");

    let detail: Value =
        serde_json::from_str(&ok(&db, &["show", &id.to_string(), "--json"]).await?)?;
    let history = detail["history"].as_array().expect("a history");
    let outcomes: Vec<&str> = history
        .iter()
        .filter_map(|a| a["outcome"].as_str())
        .collect();
    assert_eq!(outcomes, ["failed", "replayed", "delivered"]);
    assert_eq!(history[1]["relay"], "operator");
    assert_eq!(history[1]["attempt"], 0);
    assert_eq!(history[1]["downstream_key"], "charge-1");
    Ok(())
}

#[tokio::test]
async fn replay_with_a_new_key_delivers_with_the_new_key_it_recorded() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = dead_lettered(&db, &mut client, "stripe", "charge-1").await?;

    let out = ok(&db, &["replay", "--new-key", &id.to_string()]).await?;
    assert!(out.contains("charge-1 -> "), "old -> new shown: {out}");
    let detail: Value =
        serde_json::from_str(&ok(&db, &["show", &id.to_string(), "--json"]).await?)?;
    let replayed = detail["history"]
        .as_array()
        .and_then(|h| h.iter().find(|a| a["outcome"] == "replayed"))
        .expect("the replay is logged")
        .clone();
    let new_key = replayed["downstream_key"]
        .as_str()
        .expect("a key")
        .to_owned();
    assert_ne!(new_key, "charge-1");
    assert_eq!(replayed["relay"], "operator");
    let note = replayed["error"].as_str().unwrap_or_default();
    assert!(
        note.contains("charge-1") && note.contains(&new_key),
        "{note}"
    );
    assert!(out.contains(&new_key), "{out}");

    let sink = deliver(&db, &client, "stripe").await?;
    let deliveries = sink.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].downstream_key, new_key);
    let stored: String = value_with(
        &client,
        "SELECT downstream_key FROM txoutbox_delivered WHERE id = $1",
        &[&id],
    )
    .await?;
    assert_eq!(stored, new_key);
    Ok(())
}

#[tokio::test]
async fn replay_of_a_delivered_row_needs_include_delivered_and_moves_it_back() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = pending_ordered(&mut client, "email", "mail-1", "user-1").await?;
    deliver(&db, &client, "email").await?;

    let refused = txoutbox(&db, &["replay", &id.to_string()]).await?;
    let (code, err) = one_line_error(&refused);
    assert_eq!(code, Some(1));
    assert!(err.contains("--include-delivered"), "{err}");
    assert_eq!(row_status(&client, id).await?, Some(Delivered));

    ok(&db, &["replay", "--include-delivered", &id.to_string()]).await?;
    assert_eq!(row_status(&client, id).await?, Some(Pending));
    assert_eq!(counts(&client).await?.delivered, 0, "moved, not copied");
    let sink = deliver(&db, &client, "email").await?;
    let deliveries = sink.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].downstream_key, "mail-1");
    assert_eq!(deliveries[0].ordering_key.as_deref(), Some("user-1"));
    assert_eq!(row_status(&client, id).await?, Some(Delivered));
    Ok(())
}

#[tokio::test]
async fn replay_of_a_delivered_row_whose_effect_was_enqueued_again_needs_a_new_key() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let first = delivered_row(&db, &mut client, "email", "digest-1").await?;
    // The same effect enqueued again after its delivery: a hot row now carries the key.
    let again = pending(&mut client, "email", "digest-1").await?;

    let out = txoutbox(&db, &["replay", "--include-delivered", &first.to_string()]).await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(&again.to_string()),
        "names the other row: {err}"
    );
    assert_eq!(row_status(&client, first).await?, Some(Delivered));

    ok(
        &db,
        &[
            "replay",
            "--include-delivered",
            "--new-key",
            &first.to_string(),
        ],
    )
    .await?;
    assert_eq!(row_status(&client, first).await?, Some(Pending));
    let sink = deliver(&db, &client, "email").await?;
    let mut keys: Vec<String> = sink.keys();
    keys.sort();
    assert_eq!(keys.len(), 2);
    assert!(keys.contains(&"digest-1".to_owned()), "{keys:?}");
    assert_ne!(keys[0], keys[1]);
    Ok(())
}

#[tokio::test]
async fn replay_refuses_a_row_a_relay_is_delivering() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = pending(&mut client, "email", "busy-1").await?;
    let sink = HangingSink::default();
    let relay = RunningRelay::start(
        db.relay()?
            .config(relay_named("relay-under-test"))
            .sink("email", sink.clone())
            .build()?,
    );
    wait_until(&client, |c| c.in_flight == 1).await?;
    let token: i64 = value_with(
        &client,
        "SELECT lease_token FROM txoutbox_messages WHERE id = $1",
        &[&id],
    )
    .await?;
    assert_lists(&db, &["--status", "in-flight"], &[id]).await?;

    let out = txoutbox(&db, &["replay", &id.to_string()]).await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains("relay-under-test"), "names the relay: {err}");
    assert!(err.contains("lease"), "{err}");
    let row = client
        .query_one(
            "SELECT status, lease_token, lease_owner FROM txoutbox_messages WHERE id = $1",
            &[&id],
        )
        .await?;
    assert_eq!(row.get::<_, String>(0), "in_flight");
    assert_eq!(row.get::<_, i64>(1), token, "the lease is untouched");
    assert_eq!(logged(&client, AttemptOutcome::Replayed).await?, 0);
    relay.stop().await?;
    assert_eq!(sink.calls.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn replay_dry_run_prints_what_would_be_replayed_and_changes_nothing() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = dead_lettered(&db, &mut client, "stripe", "charge-1").await?;

    for args in [
        vec!["replay", "--dry-run", "--new-key", &id.to_string()],
        vec!["replay", "--dry-run", "--destination", "stripe"],
    ] {
        let out = ok(&db, &args.iter().map(|s| s.as_ref()).collect::<Vec<&str>>()).await?;
        assert!(out.starts_with("would replay 1 message\n"), "{out}");
        assert!(out.contains(&id.to_string()), "{out}");
    }
    assert_eq!(row_status(&client, id).await?, Some(Failed));
    assert_eq!(downstream_key_of(&client, id).await?, "charge-1");
    assert_eq!(logged(&client, AttemptOutcome::Replayed).await?, 0);
    Ok(())
}

#[tokio::test]
async fn replay_by_filter_takes_failed_rows_and_unknown_ones_only_when_asked() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let failed = dead_lettered(&db, &mut client, "stripe", "charge-1").await?;
    let unknown = pending(&mut client, "sms", "sms-1").await?;
    make_unknown(&db, &client, "sms", 1).await?;
    let pending = pending(&mut client, "email", "mail-1").await?;

    let out = ok(&db, &["replay"]).await?;
    assert!(out.starts_with("replayed 1 message\n"), "{out}");
    assert_eq!(row_status(&client, failed).await?, Some(Pending));
    assert_eq!(
        row_status(&client, unknown).await?,
        Some(Unknown),
        "not asked for"
    );

    let out = ok(&db, &["replay", "--status", "unknown"]).await?;
    assert!(out.starts_with("replayed 1 message\n"), "{out}");
    assert!(out.contains(&unknown.to_string()), "{out}");
    assert_eq!(row_status(&client, unknown).await?, Some(Pending));
    assert_eq!(
        logged(&client, AttemptOutcome::Replayed).await?,
        2,
        "the untouched pending row {pending} is not replayed"
    );
    Ok(())
}

#[tokio::test]
async fn replay_by_filter_takes_only_the_matching_failed_rows() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let old = dead_lettered(&db, &mut client, "stripe", "charge-old").await?;
    let new = dead_lettered(&db, &mut client, "stripe", "charge-new").await?;
    let other = dead_lettered(&db, &mut client, "webhook", "hook-1").await?;
    client
        .execute(
            "UPDATE txoutbox_messages SET created_at = now() - interval '2 days' WHERE id = $1",
            &[&old],
        )
        .await?;
    ok(&db, &["replay", "--destination", "stripe", "--since", "1d"]).await?;
    assert_eq!(row_status(&client, new).await?, Some(Pending));
    assert_eq!(row_status(&client, old).await?, Some(Failed));
    assert_eq!(row_status(&client, other).await?, Some(Failed));
    Ok(())
}

#[tokio::test]
async fn replay_of_more_than_ten_rows_needs_yes() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending_many(&mut client, "doomed", "d", 12).await?;
    dead_letter(&db, &client, "doomed", 12).await?;

    let out = txoutbox(&db, &["replay", "--destination", "doomed"]).await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains("12") && err.contains("--yes"), "{err}");
    assert_eq!(
        counts(&client).await?.failed,
        12,
        "nothing replayed without confirmation"
    );

    let out = ok(&db, &["replay", "--destination", "doomed", "--yes"]).await?;
    assert!(out.starts_with("replayed 12 messages\n"), "{out}");
    assert_eq!(counts(&client).await?.pending, 12);
    Ok(())
}

#[tokio::test]
async fn replay_of_an_unknown_id_exits_1_and_changes_nothing() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = dead_lettered(&db, &mut client, "stripe", "charge-1").await?;
    let missing = Uuid::now_v7();
    let out = txoutbox(&db, &["replay", &id.to_string(), &missing.to_string()]).await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains(&missing.to_string()), "{err}");
    assert_eq!(
        row_status(&client, id).await?,
        Some(Failed),
        "all or nothing"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// purge

/// Stores a completed idempotency key in `scope` with the given window.
async fn store_key(client: &mut Client, scope: &str, key: &str, window: Duration) -> TestResult {
    let scope = txoutbox::Scope::new(scope)?
        .with_window(window)?
        .with_min_key_len(1)?;
    let key = txoutbox::IdempotencyKey::parse(key)?;
    let fingerprint = txoutbox::Fingerprint::new("POST", "/charge", b"{}");
    let tx = client.transaction().await?;
    match txoutbox::begin(&tx, &scope, &key, &fingerprint).await? {
        txoutbox::Begin::New(claim) => {
            let response = txoutbox::StoredResponse {
                status: 201,
                headers: vec![],
                body: b"{}".to_vec(),
            };
            claim.complete(&tx, &response).await?;
        }
        other => anyhow::bail!("the key is new, not {other:?}"),
    }
    tx.commit().await?;
    Ok(())
}

/// Stores a completed key in the scope `charges`, then lets time pass: it expired a minute ago.
async fn store_expired_key(client: &mut Client, key: &str) -> TestResult {
    store_key(client, "charges", key, Duration::from_secs(3600)).await?;
    client
        .execute(
            "UPDATE txoutbox_idempotency_keys SET expires_at = now() - interval '1 minute' \
             WHERE key = $1",
            &[&key],
        )
        .await?;
    Ok(())
}

/// Time passing: the delivered row `id` was delivered `days` ago.
async fn delivered_days_ago(client: &Client, id: Uuid, days: i32) -> TestResult {
    client
        .execute(
            "UPDATE txoutbox_delivered SET delivered_at = now() - make_interval(days => $2) \
             WHERE id = $1",
            &[&id, &days],
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn purge_deletes_old_delivered_rows_and_expired_keys_only() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let old = pending(&mut client, "email", "old").await?;
    let recent = pending(&mut client, "email", "recent").await?;
    deliver(&db, &client, "email").await?;
    let failed = dead_lettered(&db, &mut client, "doomed", "doomed-1").await?;
    // Time passing: the old row was delivered eight days ago.
    delivered_days_ago(&client, old, 8).await?;
    store_expired_key(&mut client, "expired-key").await?;
    store_key(
        &mut client,
        "charges",
        "live-key",
        Duration::from_secs(3600),
    )
    .await?;

    let out = txoutbox(&db, &["purge"]).await?;
    let stdout = succeeded(&out);
    assert!(stdout.starts_with("deleted 1 delivered rows"), "{stdout}");
    assert!(stdout.contains("1 expired idempotency keys"), "{stdout}");
    assert!(out.stderr.is_empty(), "no progress bar into a pipe");

    assert_eq!(row_status(&client, old).await?, None);
    assert_eq!(row_status(&client, recent).await?, Some(Delivered));
    assert_eq!(
        row_status(&client, failed).await?,
        Some(Failed),
        "hot rows stay"
    );
    assert_eq!(
        attempts_of(&client, old).await?,
        0,
        "its attempt log goes with it"
    );
    assert_eq!(attempts_of(&client, recent).await?, 1);
    assert_eq!(attempts_of(&client, failed).await?, 1);
    let keys: Vec<String> = column(&client, "SELECT key FROM txoutbox_idempotency_keys").await?;
    assert_eq!(keys, ["live-key"]);
    Ok(())
}

#[tokio::test]
async fn purge_retention_and_skip_keys_are_honoured() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = delivered_row(&db, &mut client, "email", "two-days").await?;
    delivered_days_ago(&client, id, 2).await?;
    store_expired_key(&mut client, "expired-key").await?;

    ok(&db, &["purge"]).await?;
    assert_eq!(
        row_status(&client, id).await?,
        Some(Delivered),
        "younger than 7 days"
    );
    ok(
        &db,
        &["purge", "--retention", "1d", "--skip-keys", "--batch", "1"],
    )
    .await?;
    assert_eq!(row_status(&client, id).await?, None);
    Ok(())
}

#[tokio::test]
async fn purge_dry_run_counts_and_deletes_nothing() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = delivered_row(&db, &mut client, "email", "old").await?;
    delivered_days_ago(&client, id, 8).await?;
    store_expired_key(&mut client, "expired-key").await?;

    let out = ok(&db, &["purge", "--dry-run"]).await?;
    assert!(out.starts_with("would delete 1 delivered rows"), "{out}");
    assert!(out.contains("1 attempt-log rows"), "{out}");
    assert!(out.contains("1 expired idempotency keys"), "{out}");
    assert_eq!(row_status(&client, id).await?, Some(Delivered));
    assert_eq!(counts(&client).await?.keys, 1);
    Ok(())
}

/// Ages a failed, unknown or discarded row: enqueued, attempted and discarded `days` ago.
async fn age_row(client: &Client, id: Uuid, days: i32) -> TestResult {
    let ago = format!("now() - make_interval(days => {days})");
    client
        .batch_execute(&format!(
            "UPDATE txoutbox_messages SET created_at = {ago} WHERE id = '{id}'; \
             UPDATE txoutbox_discarded SET created_at = {ago}, discarded_at = {ago} \
                 WHERE id = '{id}'; \
             UPDATE txoutbox_attempts SET started_at = {ago}, finished_at = {ago} \
                 WHERE message_id = '{id}'"
        ))
        .await?;
    Ok(())
}

#[tokio::test]
async fn purge_keeps_failed_and_discarded_rows_90_days_and_delivered_ones_7() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let delivered = delivered_row(&db, &mut client, "email", "d-10").await?;
    delivered_days_ago(&client, delivered, 10).await?;
    let old_failed = pending(&mut client, "pay", "f-100").await?;
    let young_failed = pending(&mut client, "pay", "f-10").await?;
    let old_discarded = pending(&mut client, "pay", "x-100").await?;
    let young_discarded = pending(&mut client, "pay", "x-10").await?;
    dead_letter(&db, &client, "pay", 4).await?;
    for id in [old_discarded, young_discarded] {
        ok(&db, &["discard", &id.to_string(), "--reason", "test"]).await?;
    }
    age_row(&client, old_failed, 100).await?;
    age_row(&client, young_failed, 10).await?;
    age_row(&client, old_discarded, 100).await?;
    age_row(&client, young_discarded, 10).await?;

    let dry = ok(&db, &["purge", "--dry-run"]).await?;
    assert!(
        dry.contains("would delete 1 delivered rows")
            && dry.contains("1 failed, 0 unknown and 1 discarded rows"),
        "{dry}"
    );
    assert_eq!(row_status(&client, old_failed).await?, Some(Failed));
    let out = ok(&db, &["purge"]).await?;
    assert!(
        out.contains("1 failed, 0 unknown and 1 discarded rows"),
        "{out}"
    );
    assert_eq!(row_status(&client, delivered).await?, None);
    assert_eq!(row_status(&client, old_failed).await?, None);
    assert_eq!(
        attempts_of(&client, old_failed).await?,
        0,
        "its log goes with it"
    );
    assert_eq!(row_status(&client, young_failed).await?, Some(Failed));
    assert_eq!(attempts_of(&client, young_failed).await?, 1);
    assert_eq!(row_status(&client, old_discarded).await?, None);
    assert_eq!(attempts_of(&client, old_discarded).await?, 0);
    assert_eq!(row_status(&client, young_discarded).await?, Some(Discarded));
    assert_eq!(attempts_of(&client, young_discarded).await?, 2);

    // One duration is the delivered rows' retention, as before: failed rows keep their 90 days.
    ok(&db, &["purge", "--retention", "1d"]).await?;
    assert_eq!(row_status(&client, young_failed).await?, Some(Failed));
    ok(
        &db,
        &[
            "purge",
            "--retention",
            "delivered=7d,failed=5d,discarded=5d",
        ],
    )
    .await?;
    assert_eq!(row_status(&client, young_failed).await?, None);
    assert_eq!(row_status(&client, young_discarded).await?, None);

    let out = txoutbox(&db, &["purge", "--retention", "pending=1d"]).await?;
    assert_eq!(out.status.code(), Some(2), "pending rows have no retention");
    Ok(())
}

#[tokio::test]
async fn purging_a_failed_head_lets_the_row_behind_it_be_claimed_at_once() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let head = pending_ordered(&mut client, "pay", "k-head", "order-9").await?;
    let next = pending_ordered(&mut client, "pay", "k-next", "order-9").await?;
    let sink = ScriptedSink::new([Err(DeliveryError::permanent("card declined"))]);
    let relay = RunningRelay::start(db.relay()?.sink("pay", sink).build()?);
    wait_for_row(&client, head, Failed).await?;
    wait_parked(&client, next).await?;
    age_row(&client, head, 100).await?;

    let started = std::time::Instant::now();
    ok(&db, &["purge"]).await?;
    wait_for_row(&client, next, Delivered).await?;
    let waited = started.elapsed();
    relay.stop().await?;
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// stats

#[tokio::test]
async fn stats_counts_by_status_and_destination_with_the_failure_rate() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    dead_lettered(&db, &mut client, "doomed", "f-1").await?;
    pending(&mut client, "email", "d-1").await?;
    pending(&mut client, "email", "d-2").await?;
    deliver(&db, &client, "email").await?;
    let pending = pending(&mut client, "email", "p-1").await?;
    client
        .execute(
            "UPDATE txoutbox_messages SET created_at = now() - interval '90 seconds' WHERE id = $1",
            &[&pending],
        )
        .await?;

    let stats: Value = serde_json::from_str(&ok(&db, &["stats", "--json"]).await?)?;
    let destinations = stats["destinations"].as_array().expect("destinations");
    let of = |name: &str| {
        destinations
            .iter()
            .find(|d| d["destination"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(of("email")["pending"], 1);
    assert_eq!(of("email")["delivered"], 2);
    assert_eq!(of("email")["failed"], 0);
    assert_eq!(of("doomed")["failed"], 1);
    assert_eq!(stats["total"]["pending"], 1);
    assert_eq!(stats["total"]["delivered"], 2);
    assert_eq!(stats["total"]["failed"], 1);
    let age = stats["oldest_pending_age"].as_f64().expect("an age");
    assert!((90.0..600.0).contains(&age), "{age}");
    assert_eq!(stats["last_hour"]["attempts"], 3);
    assert_eq!(stats["last_hour"]["failures"], 1);
    let rate = stats["last_hour"]["rate"].as_f64().expect("a rate");
    assert!((rate - 1.0 / 3.0).abs() < 1e-9, "{rate}");
    assert_eq!(of("doomed")["last_hour"]["rate"], 1.0);

    let table = ok(&db, &["stats"]).await?;
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("DESTINATION"), "{table}");
    assert!(lines.iter().any(|l| l.starts_with("TOTAL")), "{table}");
    assert!(table.contains("33.3% (1/3)"), "{table}");
    Ok(())
}

#[tokio::test]
async fn stats_counts_the_requests_whose_effects_wait_for_the_fan_out() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let table = ok(&db, &["stats"]).await?;
    assert!(!table.contains("AWAITING FAN-OUT"), "{table}");
    let scope = txoutbox::Scope::new("orders")?.with_deferred_effects();
    for n in 0..3 {
        let tx = client.transaction().await?;
        let key = txoutbox::IdempotencyKey::parse(&format!("order-key-{n:0>8}"))?;
        let fingerprint = txoutbox::Fingerprint::new("POST", "/orders", b"{}");
        let txoutbox::Begin::New(mut claim) =
            txoutbox::begin(&tx, &scope, &key, &fingerprint).await?
        else {
            panic!("a new key");
        };
        claim.enqueue("receipt", txoutbox::OutboxMessage::new("email", &n)?)?;
        claim.enqueue("charge", txoutbox::OutboxMessage::new("stripe", &n)?)?;
        let response = empty_created();
        claim.commit(tx, &response).await?;
    }
    let stats: Value = serde_json::from_str(&ok(&db, &["stats", "--json"]).await?)?;
    assert_eq!(stats["awaiting_fan_out"], 3);
    assert!(stats["oldest_awaiting_fan_out_age"].as_f64().is_some());
    assert_eq!(stats["total"]["pending"], 0, "not in the outbox yet");
    let table = ok(&db, &["stats"]).await?;
    assert!(table.contains("AWAITING FAN-OUT: 3 requests"), "{table}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// discard

/// Waits until `id` was parked by a claim (it waits behind the head of its ordering key).
async fn wait_parked(client: &Client, id: Uuid) -> TestResult {
    eventually_some("the row parked behind its ordering key's head", || async {
        let parked = client
            .query_opt(
                "SELECT 1 FROM txoutbox_messages WHERE id = $1 AND status = 'pending' \
                 AND next_attempt_at > now() + interval '10 seconds'",
                &[&id],
            )
            .await?;
        Ok(parked.map(|_| ()))
    })
    .await
}

#[tokio::test]
async fn discarding_a_dead_lettered_head_lets_a_running_relay_deliver_the_row_behind_it(
) -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let head = pending_ordered(&mut client, "pay", "k-head", "order-7").await?;
    let next = pending_ordered(&mut client, "pay", "k-next", "order-7").await?;
    let sink = ScriptedSink::new([Err(DeliveryError::permanent("card declined"))]);
    let relay = RunningRelay::start(db.relay()?.sink("pay", sink.clone()).build()?);
    wait_for_row(&client, head, Failed).await?;
    wait_parked(&client, next).await?;

    let started = std::time::Instant::now();
    let out = ok(
        &db,
        &["discard", &head.to_string(), "--reason", "refunded by hand"],
    )
    .await?;
    assert!(out.starts_with("discarded 1 message"), "{out}");
    wait_for_row(&client, next, Delivered).await?;
    let waited = started.elapsed();
    relay.stop().await?;
    assert!(
        waited < Duration::from_secs(3),
        "the row behind the discarded head waited {waited:?}"
    );
    let keys: Vec<String> = sink
        .recorder
        .deliveries()
        .iter()
        .map(|d| d.downstream_key.clone())
        .collect();
    assert_eq!(
        keys,
        ["k-head", "k-next"],
        "the head is not delivered again"
    );
    assert_eq!(row_status(&client, head).await?, Some(Discarded));
    Ok(())
}

#[tokio::test]
async fn a_discard_is_shown_with_its_reason_listed_and_counted() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = dead_lettered(&db, &mut client, "pay", "k-1").await?;
    ok(
        &db,
        &[
            "discard",
            &id.to_string(),
            "--reason",
            "duplicate order, customer informed",
        ],
    )
    .await?;

    let shown: Value = serde_json::from_str(&ok(&db, &["show", &id.to_string(), "--json"]).await?)?;
    assert_eq!(shown["status"], "discarded");
    assert!(shown["discarded_at"].is_string(), "{shown}");
    assert_eq!(shown["last_error"], "422 rejected by the downstream");
    let last = shown["history"].as_array().and_then(|h| h.last()).cloned();
    let last = last.unwrap_or(Value::Null);
    assert_eq!(last["outcome"], "discarded");
    assert_eq!(last["relay"], "operator");
    assert_eq!(last["attempt"], 0);
    assert_eq!(last["error"], "duplicate order, customer informed");
    let text = ok(&db, &["show", &id.to_string()]).await?;
    assert!(
        text.contains("duplicate order, customer informed"),
        "{text}"
    );

    assert_lists(&db, &["--status", "discarded"], &[id]).await?;
    assert_lists(&db, &["--status", "failed"], &[]).await?;

    let stats: Value = serde_json::from_str(&ok(&db, &["stats", "--json"]).await?)?;
    assert_eq!(stats["total"]["discarded"], 1);
    assert_eq!(stats["total"]["failed"], 0);
    let table = ok(&db, &["stats"]).await?;
    assert!(
        table.lines().next().unwrap_or("").contains("DISCARDED"),
        "{table}"
    );
    Ok(())
}

#[tokio::test]
async fn discard_refuses_pending_rows_and_needs_a_reason_changing_nothing() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let pending = pending(&mut client, "pay", "k-1").await?;
    let out = txoutbox(&db, &["discard", &pending.to_string(), "--reason", "x"]).await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains("pending"), "{err}");
    let out = txoutbox(&db, &["discard", &pending.to_string()]).await?;
    assert_eq!(out.status.code(), Some(2), "--reason is required");
    let out = txoutbox(&db, &["discard", &pending.to_string(), "--reason", "  "]).await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains("reason"), "{err}");
    assert_eq!(row_status(&client, pending).await?, Some(Pending));
    Ok(())
}

#[tokio::test]
async fn discard_by_filter_needs_yes_above_ten_rows_and_dry_run_changes_nothing() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending_many(&mut client, "pay", "k", 11).await?;
    dead_letter(&db, &client, "pay", 11).await?;

    let out = txoutbox(
        &db,
        &["discard", "--destination", "pay", "--reason", "test data"],
    )
    .await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains("--yes"), "{err}");
    let dry = ok(
        &db,
        &[
            "discard",
            "--destination",
            "pay",
            "--reason",
            "test data",
            "--dry-run",
        ],
    )
    .await?;
    assert!(dry.starts_with("would discard 11 messages"), "{dry}");
    assert_eq!(counts(&client).await?.failed, 11);

    ok(
        &db,
        &[
            "discard",
            "--destination",
            "pay",
            "--reason",
            "test data",
            "--yes",
        ],
    )
    .await?;
    assert_eq!(counts(&client).await?.failed, 0);
    assert_eq!(counts(&client).await?.discarded, 11);
    let discards = log_of(&client, AttemptOutcome::Discarded).await?;
    assert_eq!(discards.len(), 11);
    for entry in discards {
        assert_eq!(
            (entry.relay.as_str(), entry.error.as_deref(), entry.attempt),
            ("operator", Some("test data"), 0),
            "{entry:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_discarded_row_is_not_replayed() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = dead_lettered(&db, &mut client, "pay", "k-1").await?;
    ok(&db, &["discard", &id.to_string(), "--reason", "not wanted"]).await?;
    let out = txoutbox(&db, &["replay", &id.to_string()]).await?;
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains("discarded"), "{err}");
    Ok(())
}

/// A connection whose statements' plans come back as notices (auto_explain, every statement).
async fn explaining_client(
    db: &TestDb,
) -> anyhow::Result<(Client, tokio::sync::mpsc::UnboundedReceiver<String>)> {
    let (client, mut connection) = db.config()?.connect().await?;
    let (plans, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notice(notice) = message {
                let _ = plans.send(notice.message().to_owned());
            }
        }
    });
    client
        .batch_execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; \
             SET auto_explain.log_level = notice; SET client_min_messages = notice",
        )
        .await?;
    Ok((client, received))
}

#[tokio::test]
async fn stats_and_list_of_delivered_rows_read_no_more_than_an_index_page_of_a_large_history(
) -> TestResult {
    let (db, mut client) = test_db_with_sql(
        "INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, \
                 downstream_key, attempts, created_at, delivered_at) \
             SELECT gen_random_uuid(), g, (ARRAY['email', 'stripe', 'webhook'])[1 + g % 3], \
                 '{}', '{}', 'k-' || g, 1, now() - make_interval(secs => 300000 - g), \
                 now() - make_interval(secs => 300000 - g) \
             FROM generate_series(1, 200000) g",
    )
    .await?;
    client
        .batch_execute("VACUUM ANALYZE txoutbox_delivered")
        .await?;
    pending(&mut client, "email", "pending-1").await?;
    let (explained, mut plans) = explaining_client(&db).await?;

    let stats = txoutbox::admin::stats(&explained).await?;
    assert!(stats.delivered_estimated);
    let total = stats.total.delivered as f64;
    assert!((180_000.0..220_000.0).contains(&total), "estimate {total}");
    let email = stats.destinations.iter().find(|d| d.destination == "email");
    let email = email.map(|d| d.counts.delivered as f64).unwrap_or(0.0);
    assert!(
        (50_000.0..85_000.0).contains(&email),
        "email estimate {email}"
    );
    assert_eq!(stats.total.pending, 1);

    let filter = txoutbox::admin::MessageFilter {
        status: Some(txoutbox::admin::MessageStatus::Delivered),
        limit: Some(50),
        ..txoutbox::admin::MessageFilter::default()
    };
    let page = txoutbox::admin::list_messages(&explained, &filter).await?;
    assert_eq!(page.len(), 50);
    assert_eq!(page[0].seq, 200_000, "newest first");
    let next = txoutbox::admin::list_messages(
        &explained,
        &txoutbox::admin::MessageFilter {
            before: page.last().map(|m| m.cursor()),
            ..filter
        },
    )
    .await?;
    assert_eq!(next.first().map(|m| m.seq), Some(199_950), "the page after");

    drop(explained);
    let mut all = Vec::new();
    while let Some(plan) = plans.recv().await {
        all.push(plan);
    }
    let reading: Vec<&String> = all
        .iter()
        .filter(|p| p.contains("on txoutbox_delivered"))
        .collect();
    assert!(
        reading.len() >= 3,
        "the plans of stats and two list pages: {all:#?}"
    );
    for plan in reading {
        assert!(!plan.contains("Seq Scan on txoutbox_delivered"), "{plan}");
        assert!(
            !plan.contains("Bitmap Heap Scan on txoutbox_delivered"),
            "{plan}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn stats_prints_a_large_delivered_history_as_a_marked_estimate() -> TestResult {
    let (db, _) = test_db_with_sql(
        "INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, \
                 downstream_key, attempts, created_at) \
             SELECT gen_random_uuid(), g, 'email', '{}', '{}', 'k-' || g, 1, now() \
             FROM generate_series(1, 20000) g; \
             ANALYZE txoutbox_delivered",
    )
    .await?;
    let table = ok(&db, &["stats"]).await?;
    assert!(table.contains("~20 000 (estimate)"), "{table}");
    let stats: Value = serde_json::from_str(&ok(&db, &["stats", "--json"]).await?)?;
    assert_eq!(stats["delivered_estimated"], true);
    Ok(())
}

#[tokio::test]
async fn stats_of_a_backlog_beyond_the_exact_bound_samples_pending_and_counts_the_rest(
) -> TestResult {
    // 120 000 hot rows over two destinations, a thousand of them failed, the oldest pending row
    // two hours old.
    let (db, client) = test_db_with_sql(
        "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key, status, \
                 attempts, last_error, created_at) \
             SELECT gen_random_uuid(), CASE WHEN g % 4 = 0 THEN 'sms' ELSE 'email' END, '{}', \
                 'k-' || g, CASE WHEN g % 120 = 0 THEN 'failed' ELSE 'pending' END, \
                 (g % 120 = 0)::int, CASE WHEN g % 120 = 0 THEN 'declined' END, \
                 now() - make_interval(secs => 7200 - g * 0.05) \
             FROM generate_series(1, 120000) g; \
             ANALYZE txoutbox_messages",
    )
    .await?;
    let stats = txoutbox::admin::stats(&client).await?;
    assert!(stats.hot_estimated);
    assert_eq!(stats.total.failed, 1000, "failed rows are counted exactly");
    let pending = stats.total.pending as f64;
    assert!(
        (100_000.0..140_000.0).contains(&pending),
        "pending estimate {pending} for 119 000"
    );
    let sms = stats.destinations.iter().find(|d| d.destination == "sms");
    let sms = sms.map(|d| d.counts.pending as f64).unwrap_or(0.0);
    assert!(
        (22_000.0..38_000.0).contains(&sms),
        "sms estimate {sms} for 29 750"
    );
    let oldest = stats.oldest_pending_age.map(|d| d.as_secs()).unwrap_or(0);
    assert!(
        (7190..7300).contains(&oldest),
        "the oldest pending age is exact: {oldest}"
    );
    let table = ok(&db, &["stats"]).await?;
    assert!(
        table.contains("(estimate)") && table.contains(" 1000 "),
        "{table}"
    );
    let json: Value = serde_json::from_str(&ok(&db, &["stats", "--json"]).await?)?;
    assert_eq!(json["hot_estimated"], true);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// arguments and errors

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["list", "--status", "dead"][..],
        &["list", "--since", "yesterday"],
        &["list", "--until", "2026-13-45"],
        &["list", "--limit", "many"],
        &["show", "not-a-uuid"],
        &["replay", "--status", "pending"],
        &["replay", "--status", "delivered"],
        &[
            "replay",
            "0190f5b2-7c4e-7a1d-9b3e-2f1a0c9d8e7f",
            "--destination",
            "x",
        ],
        &["purge", "--retention", "forever"],
        &["purge", "--batch", "0"],
        &["purge", "--skip-keys", "--key-window-expired-only"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_txoutbox"))
            .args(args)
            .env("DATABASE_URL", "host=127.0.0.1 port=1 dbname=none")
            .output()
            .expect("runs");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_operator_command_has_help_with_examples() {
    for command in ["list", "show", "replay", "purge", "stats"] {
        let out = Command::new(env!("CARGO_BIN_EXE_txoutbox"))
            .args([command, "--help"])
            .output()
            .expect("runs");
        assert!(out.status.success());
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Examples:"), "{command}: {help}");
        assert!(
            help.contains(&format!("txoutbox {command}")),
            "{command}: {help}"
        );
    }
}

#[test]
fn an_unreachable_database_is_one_line_and_exit_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_txoutbox"))
        .args(["list"])
        .env(
            "DATABASE_URL",
            "postgres://nobody@127.0.0.1:1/none?connect_timeout=2",
        )
        .output()
        .expect("runs");
    let (code, err) = one_line_error(&out);
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot connect to the database"), "{err}");
}
