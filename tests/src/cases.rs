//! The write path's behaviours, each a function generic over the [`Driver`]: what a service on
//! any driver observes (answers, rows, effects), checked with counts read over tokio-postgres.

use std::time::Duration;

use anyhow::Result;
use tokio_postgres::Client;
use txoutbox::{Error, Scope};
use txoutbox_test_support::request::{create_charges, db_with_orders};
use txoutbox_test_support::{count, keys_expired, Cluster, ClusterOptions, TestDb};

use txoutbox::inbox::{derive_inbox_downstream_key, Consumer};

use crate::{Delivery, Driver, Finish, Outcome, Request, RowOutcome};

const ORDERS: &str = "orders";
const MESSAGES: &str = "txoutbox_messages";
const KEYS: &str = "txoutbox_idempotency_keys";
const INBOX: &str = "txoutbox_inbox";

/// A test database with the business tables `orders` and `charges`, a tokio-postgres client
/// for the assertions, and a connection of the driver's.
async fn setup<D: Driver>() -> Result<(TestDb, Client, D::Conn)> {
    let (db, client) = db_with_orders().await?;
    create_charges(&client).await?;
    let conn = D::connect(db.info()).await?;
    Ok((db, client, conn))
}

/// The rows of `tables`, in order.
async fn counts(client: &Client, tables: &[&str]) -> Result<Vec<i64>> {
    let mut counts = Vec::with_capacity(tables.len());
    for table in tables {
        counts.push(count(client, table).await?);
    }
    Ok(counts)
}

fn charges() -> Result<Scope> {
    Ok(Scope::new("charges")?)
}

/// A new key: the work runs once, its effects are written, the key is stored with its answer.
pub async fn a_new_key_runs_the_request_and_writes_its_effects<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let outcome = D::request(&mut conn, Request::new(charges()?, "k-new", 1)?).await?;
    let Outcome::New(enqueued) = outcome else {
        anyhow::bail!("a new key was answered {outcome:?}");
    };
    assert_eq!(enqueued.written().len(), 2);
    assert!(enqueued.all_written());
    assert_eq!(counts(&client, &[ORDERS, MESSAGES, KEYS]).await?, [1, 2, 1]);
    Ok(())
}

/// The same key and request again: the stored answer, byte for byte, and no second row.
pub async fn a_retry_with_the_same_key_replays_the_stored_answer<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let first = Request::new(charges()?, "k-replay", 1)?;
    let stored = first.response();
    assert!(matches!(
        D::request(&mut conn, first).await?,
        Outcome::New(_)
    ));
    let again = D::request(&mut conn, Request::new(charges()?, "k-replay", 1)?).await?;
    let Outcome::Replay(replayed) = again else {
        anyhow::bail!("a retry was answered {again:?}");
    };
    assert_eq!(replayed, stored);
    assert_eq!(counts(&client, &[ORDERS, MESSAGES, KEYS]).await?, [1, 2, 1]);
    Ok(())
}

/// The same key for another request: a mismatch (422), nothing written.
pub async fn the_same_key_for_another_request_is_a_mismatch<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    assert!(matches!(
        D::request(&mut conn, Request::new(charges()?, "k-other", 1)?).await?,
        Outcome::New(_)
    ));
    let other = D::request(&mut conn, Request::new(charges()?, "k-other", 2)?).await?;
    assert!(matches!(other, Outcome::Mismatch), "{other:?}");
    assert_eq!(counts(&client, &[ORDERS, MESSAGES]).await?, [1, 2]);
    Ok(())
}

/// A key another transaction holds past the scope's lock timeout: in flight (409); the holder's
/// commit then wins, and a retry replays its answer.
pub async fn a_key_held_past_the_lock_timeout_is_in_flight<D: Driver>() -> Result<()> {
    let (db, client, mut conn) = setup::<D>().await?;
    let scope = charges()?.with_lock_timeout(Duration::from_millis(50))?;
    let mut holder = db.connect().await?;
    let held = holder.transaction().await?;
    let request = Request::new(scope.clone(), "k-held", 1)?;
    let txoutbox::Begin::New(claim) =
        txoutbox::begin(&held, &scope, &request.key, &request.fingerprint).await?
    else {
        anyhow::bail!("the holder's key was not new");
    };
    let waiting = D::request(&mut conn, Request::new(scope.clone(), "k-held", 1)?).await?;
    assert!(matches!(waiting, Outcome::InFlight), "{waiting:?}");
    claim.complete(&held, &request.response()).await?;
    held.commit().await?;
    let retry = D::request(&mut conn, Request::new(scope, "k-held", 1)?).await?;
    assert!(matches!(retry, Outcome::Replay(_)), "{retry:?}");
    assert_eq!(counts(&client, &[ORDERS, KEYS]).await?, [0, 1]);
    Ok(())
}

/// Postgres down inside the request's transaction: unavailable (503), never a new key; the
/// retry once it is back runs the request.
pub async fn an_unreachable_postgres_is_unavailable_not_new<D: Driver>() -> Result<()> {
    let cluster = std::sync::Arc::new(Cluster::private(&ClusterOptions::default())?);
    let db = TestDb::create_on(&cluster.admin()).await?;
    db.connect()
        .await?
        .batch_execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL)")
        .await?;
    let mut conn = D::connect(db.info()).await?;
    let mut request = Request::new(charges()?, "k-down", 1)?;
    let stopped = cluster.clone();
    request.after_begin = Some(Box::new(move || stopped.stop()));
    let outcome = D::request(&mut conn, request).await?;
    let Outcome::Failed(err) = outcome else {
        anyhow::bail!("a request while Postgres is down was answered {outcome:?}");
    };
    assert!(err.is_unavailable(), "{err:?}");
    assert_eq!(err.http_status(), 503);
    cluster.start()?;
    let mut conn = D::connect(db.info()).await?;
    let retry = D::request(&mut conn, Request::new(charges()?, "k-down", 1)?).await?;
    assert!(matches!(retry, Outcome::New(_)), "{retry:?}");
    drop(conn);
    drop(db);
    Ok(())
}

/// Fifty requests with one key at once: one business row, one set of effects, every other
/// request answered with the stored answer (or 409 while it waited).
pub async fn fifty_concurrent_requests_with_one_key_do_the_work_once<D: Driver>() -> Result<()> {
    let (db, client, _conn) = setup::<D>().await?;
    let answers = fifty_at_once::<D, _, _, _>(&db, |mut conn| async move {
        D::request(&mut conn, Request::new(charges()?, "k-fifty", 1)?).await
    })
    .await?;
    let stored = Request::new(charges()?, "k-fifty", 1)?.response();
    let mut new = 0;
    for answer in answers {
        match answer {
            Outcome::New(_) => new += 1,
            Outcome::Replay(replayed) => assert_eq!(replayed, stored),
            Outcome::InFlight => {}
            other => anyhow::bail!("a concurrent request was answered {other:?}"),
        }
    }
    assert_eq!(new, 1);
    assert_eq!(counts(&client, &[ORDERS, MESSAGES, KEYS]).await?, [1, 2, 1]);
    Ok(())
}

/// A key past its window is taken over: the request runs again, and its effects get new
/// downstream keys (they are new effects, not the old ones again).
pub async fn a_key_past_its_window_runs_again_with_new_downstream_keys<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let scope = charges()?.with_window(Duration::from_millis(1))?;
    assert!(matches!(
        D::request(&mut conn, Request::new(scope.clone(), "k-window", 1)?).await?,
        Outcome::New(_)
    ));
    keys_expired(&client, &scope).await?;
    let again = D::request(&mut conn, Request::new(scope, "k-window", 1)?).await?;
    assert!(matches!(again, Outcome::New(_)), "{again:?}");
    let distinct = "SELECT count(DISTINCT downstream_key) FROM txoutbox_messages";
    assert_eq!(
        counts(&client, &[ORDERS, MESSAGES, distinct, KEYS]).await?,
        [2, 4, 4, 1]
    );
    Ok(())
}

/// A scope with deferred effects: the effects ride on the key row (one row written besides the
/// business row), for the relay to fan out.
pub async fn deferred_effects_ride_on_the_key_row<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let scope = charges()?.with_deferred_effects();
    let outcome = D::request(&mut conn, Request::new(scope, "k-deferred", 1)?).await?;
    let Outcome::New(enqueued) = outcome else {
        anyhow::bail!("a new key was answered {outcome:?}");
    };
    assert_eq!(enqueued.written().len(), 2);
    let carried = "SELECT coalesce(sum(jsonb_array_length(effects)), 0)::int8 \
                   FROM txoutbox_idempotency_keys";
    assert_eq!(
        counts(&client, &[ORDERS, MESSAGES, carried]).await?,
        [1, 0, 2]
    );
    Ok(())
}

/// `Claim::commit`: the key, the answer, the effects and the business row committed in one call;
/// the retry replays.
pub async fn claim_commit_stores_the_key_and_commits<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let request = Request::new(charges()?, "k-commit", 1)?.finish(Finish::ClaimCommit);
    let outcome = D::request(&mut conn, request).await?;
    assert!(matches!(outcome, Outcome::New(_)), "{outcome:?}");
    assert_eq!(counts(&client, &[ORDERS, MESSAGES, KEYS]).await?, [1, 2, 1]);
    let retry = Request::new(charges()?, "k-commit", 1)?.finish(Finish::ClaimCommit);
    assert!(matches!(
        D::request(&mut conn, retry).await?,
        Outcome::Replay(_)
    ));
    Ok(())
}

/// `Claim::commit` in a savepoint is refused (its COMMIT would end the outer transaction):
/// nothing of either transaction is committed, and the connection serves the next request.
pub async fn claim_commit_refuses_a_savepoint<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let request = Request::new(charges()?, "k-savepoint", 1)?;
    let refused = D::commit_in_savepoint(&mut conn, request).await?;
    assert!(matches!(refused, Error::Internal(_)), "{refused:?}");
    assert!(refused.to_string().contains("savepoint"), "{refused}");
    assert_eq!(counts(&client, &[ORDERS, MESSAGES, KEYS]).await?, [0, 0, 0]);
    let next = D::request(&mut conn, Request::new(charges()?, "k-savepoint", 1)?).await?;
    assert!(matches!(next, Outcome::New(_)), "{next:?}");
    assert_eq!(counts(&client, &[ORDERS, MESSAGES, KEYS]).await?, [1, 2, 1]);
    Ok(())
}

/// A rollback after the answer was stored leaves nothing: no key, no row, no effect; the retry
/// runs the request.
pub async fn a_rollback_leaves_nothing<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let request = Request::new(charges()?, "k-rollback", 1)?.finish(Finish::CompleteThenRollback);
    assert!(matches!(
        D::request(&mut conn, request).await?,
        Outcome::New(_)
    ));
    assert_eq!(counts(&client, &[ORDERS, MESSAGES, KEYS]).await?, [0, 0, 0]);
    let retry = D::request(&mut conn, Request::new(charges()?, "k-rollback", 1)?).await?;
    assert!(matches!(retry, Outcome::New(_)), "{retry:?}");
    Ok(())
}

/// `BusinessKey`: the business row is the key record: new, then the same row replayed, then a
/// mismatch for another request; one effect, enqueued once.
pub async fn business_key_replays_the_first_row_and_refuses_another_request<D: Driver>(
) -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let key = txoutbox_test_support::request::key("k-business");
    let RowOutcome::New(id) = D::business_request(&mut conn, &key, 100).await? else {
        anyhow::bail!("a new key was not new");
    };
    assert_eq!(
        D::business_request(&mut conn, &key, 100).await?,
        RowOutcome::Replay(id)
    );
    assert_eq!(
        D::business_request(&mut conn, &key, 200).await?,
        RowOutcome::Mismatch
    );
    assert_eq!(
        counts(&client, &["charges", MESSAGES, KEYS]).await?,
        [1, 1, 0]
    );
    Ok(())
}

/// Fifty runs of `work`, each on a connection of its own, let go at once: their answers, in
/// the order they were started.
async fn fifty_at_once<D, T, F, Fut>(db: &TestDb, work: F) -> Result<Vec<T>>
where
    D: Driver,
    F: Fn(D::Conn) -> Fut,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (barrier, work) = (barrier.clone(), work(D::connect(db.info()).await?));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            work.await
        }));
    }
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await??);
    }
    Ok(answers)
}

fn shipping() -> Result<Consumer> {
    Ok(Consumer::new("shipping")?)
}

/// Delivers message `id` to `consumer`, which must find it new: the effects its handler wrote.
async fn new_delivery<D: Driver>(
    conn: &mut D::Conn,
    consumer: &Consumer,
    id: &str,
) -> Result<txoutbox::Enqueued> {
    match D::deliver(conn, consumer, id).await? {
        Delivery::New(enqueued) => Ok(enqueued),
        other => anyhow::bail!("the new message {id} was answered {other:?}"),
    }
}

/// One order, its onward effect and its inbox record: the handler ran once, whatever came.
async fn handled_once(client: &Client) -> Result<()> {
    assert_eq!(counts(client, &[ORDERS, MESSAGES, INBOX]).await?, [1, 1, 1]);
    Ok(())
}

/// A new message: the handler runs once, its record and its onward effect commit with its row.
pub async fn a_new_message_runs_the_handler_and_is_recorded<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    let enqueued = new_delivery::<D>(&mut conn, &shipping()?, "msg_new").await?;
    assert_eq!(enqueued.written().len(), 1);
    handled_once(&client).await?;
    Ok(())
}

/// The same message again: a duplicate, the handler not run, nothing more written; another
/// consumer has its own id space and applies it once too.
pub async fn a_redelivered_message_is_a_duplicate<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    new_delivery::<D>(&mut conn, &shipping()?, "msg_dup").await?;
    for _ in 0..3 {
        let again = D::deliver(&mut conn, &shipping()?, "msg_dup").await?;
        assert!(matches!(again, Delivery::Duplicate), "{again:?}");
    }
    handled_once(&client).await?;
    new_delivery::<D>(&mut conn, &Consumer::new("billing")?, "msg_dup").await?;
    assert_eq!(counts(&client, &[ORDERS, INBOX]).await?, [2, 2]);
    Ok(())
}

/// Fifty deliveries of one message at once: one handler run, one onward effect; every other
/// delivery is a duplicate, or a conflict (409) after the lock timeout, never a second effect.
pub async fn fifty_concurrent_deliveries_of_one_message_make_one_effect<D: Driver>() -> Result<()> {
    let (db, client, _conn) = setup::<D>().await?;
    let answers = fifty_at_once::<D, _, _, _>(&db, |mut conn| async move {
        D::deliver(&mut conn, &shipping()?, "msg_fifty").await
    })
    .await?;
    let mut new = 0;
    for answer in answers {
        match answer {
            Delivery::New(_) => new += 1,
            Delivery::Duplicate => {}
            Delivery::Failed(Error::Conflict { .. }) => {}
            other => anyhow::bail!("a concurrent delivery was answered {other:?}"),
        }
    }
    assert_eq!(new, 1);
    handled_once(&client).await?;
    Ok(())
}

/// The onward effect's downstream key derives from (consumer, message id, effect): the
/// documented rule, the same on every driver.
pub async fn an_onward_effect_gets_the_key_derived_from_the_message<D: Driver>() -> Result<()> {
    let (_db, client, mut conn) = setup::<D>().await?;
    new_delivery::<D>(&mut conn, &shipping()?, "msg_key").await?;
    let row = client
        .query_one("SELECT downstream_key FROM txoutbox_messages", &[])
        .await?;
    let key: String = row.try_get(0)?;
    assert_eq!(
        key,
        derive_inbox_downstream_key("shipping", "msg_key", "ships-email")
    );
    Ok(())
}
