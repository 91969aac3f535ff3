//! The circuit breaker against a real Postgres: what a half-open breaker probes with.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use txoutbox::admin::MessageStatus;
use txoutbox::relay::{
    Breaker, DestinationPolicy, FlowControl, RelayConfig, RetryPolicy, Semantics,
};
use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};
use txoutbox_test_support::factory::db_with_pending;
use txoutbox_test_support::factory::pending;
use txoutbox_test_support::factory::{message, nested_too_deep};
use txoutbox_test_support::relay::{relay_config, RunningRelay};
use txoutbox_test_support::{eventually, eventually_async, status, TestDb};

type TestResult = anyhow::Result<()>;

/// How long the tests wait for a probe to reach the downstream.
const PROBE_WAIT: Duration = Duration::from_secs(30);

/// A downstream that fails every call of a row whose key starts with `bad` (a 503 without
/// `Retry-After`: retryable, counted by the breaker), refuses every row whose key starts with
/// `poison` (a 422: permanent, the row's own fault), never answers a row whose key starts with
/// `hang`, and takes every other; it records when each call started.
#[derive(Clone, Default)]
struct PartlyBroken {
    calls: Arc<Mutex<Vec<(String, Instant)>>>,
}

impl PartlyBroken {
    fn calls(&self) -> Vec<(String, Instant)> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// When the row `key` was first called, waiting at most `limit`.
    async fn first_call(&self, key: &str, limit: Duration) -> Option<Instant> {
        let seen = || {
            self.calls()
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, at)| *at)
        };
        let _ = tokio::time::timeout(limit, eventually(key, || seen().is_some())).await;
        seen()
    }
}

#[async_trait::async_trait]
impl Sink for PartlyBroken {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push((delivery.downstream_key.clone(), Instant::now()));
        }
        if delivery.downstream_key.starts_with("hang") {
            std::future::pending::<()>().await;
        }
        if delivery.downstream_key.starts_with("bad") {
            Err(DeliveryError::retryable("503 Service Unavailable"))
        } else if delivery.downstream_key.starts_with("poison") {
            Err(DeliveryError::permanent("422 Unprocessable Entity"))
        } else {
            Ok(Receipt::new("200"))
        }
    }
}

/// Retries at once, and a breaker that opens after 3 failures for 1 s at every opening.
fn one_second_breaker() -> DestinationPolicy {
    DestinationPolicy {
        retry: RetryPolicy {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(50),
            max_attempts: 1000,
        },
        semantics: Semantics::AtLeastOnce,
        flow: FlowControl {
            breaker: Some(Breaker {
                failures: 3,
                cool_down: Duration::from_secs(1),
                max_cool_down: Duration::from_secs(1),
            }),
            ..FlowControl::default()
        },
    }
}

/// Waits until the breaker of `x` is open, as `txoutbox stats` shows it.
async fn wait_open(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    eventually_async("the failing rows opened the breaker", || async {
        let flows = txoutbox::admin::destination_flows(client).await?;
        Ok(flows
            .iter()
            .any(|f| f.destination == "x" && f.state == "open"))
    })
    .await
}

/// Four failing rows of `x` and a relay whose calls to `x` open its breaker, once it is open.
async fn open_breaker() -> anyhow::Result<(TestDb, Client, PartlyBroken, RunningRelay)> {
    open_breaker_with(relay_config()).await
}

/// [`open_breaker`] with a lease of a minute: longer than the tests wait for a probe (30 s), so
/// a probe that waits out the lease of the one before it is seen never to go.
async fn open_breaker_with_a_minute_lease(
) -> anyhow::Result<(TestDb, Client, PartlyBroken, RunningRelay)> {
    open_breaker_with(relay_config().with_lease(Duration::from_secs(60))).await
}

/// [`open_breaker`] with the relay's configuration `config`.
async fn open_breaker_with(
    config: RelayConfig,
) -> anyhow::Result<(TestDb, Client, PartlyBroken, RunningRelay)> {
    let (db, client) = db_with_pending("x", "bad", 4).await?;
    let downstream = PartlyBroken::default();
    let relay = RunningRelay::start(
        db.relay()?
            .config(config)
            .sink("x", downstream.clone())
            .policy("x", one_second_breaker())
            .build()?,
    );
    wait_open(&client).await?;
    Ok((db, client, downstream, relay))
}

/// Rows that fail on their own open the breaker; a healthy row enqueued while it is open is the
/// probe, not one of the failing rows (which are due the longest): the destination closes at the
/// first probe instead of staying shut one doubled cool-down per failing row.
#[tokio::test(flavor = "multi_thread")]
async fn a_half_open_breaker_probes_with_a_row_never_tried_not_a_failing_one() -> TestResult {
    let (_db, mut client, downstream, relay) = open_breaker().await?;
    let enqueued = Instant::now();
    pending(&mut client, "x", "good-0").await?;
    let probed = downstream.first_call("good-0", PROBE_WAIT).await;
    relay.stop().await?;
    let probed = probed.ok_or_else(|| anyhow::anyhow!("the healthy row was never called"))?;
    let failing_probes: Vec<String> = downstream
        .calls()
        .into_iter()
        .filter(|(key, at)| key.starts_with("bad") && *at > enqueued && *at < probed)
        .map(|(key, _)| key)
        .collect();
    assert!(
        failing_probes.is_empty(),
        "the breaker probed with failing rows while a row never tried waited: {failing_probes:?}"
    );
    Ok(())
}

/// A row never tried that another transaction holds locked does not stop the probing: the probe
/// is the next row never tried.
#[tokio::test(flavor = "multi_thread")]
async fn a_locked_row_never_tried_does_not_stop_the_probe() -> TestResult {
    let (db, mut client, downstream, relay) = open_breaker().await?;
    pending(&mut client, "x", "locked-0").await?;
    pending(&mut client, "x", "good-0").await?;
    let mut holder = db.connect().await?;
    let hold = holder.transaction().await?;
    let locked = hold
        .query(
            "SELECT id FROM txoutbox_messages WHERE downstream_key = 'locked-0' FOR UPDATE",
            &[],
        )
        .await?;
    assert_eq!(locked.len(), 1, "the row is held");
    let probed = downstream.first_call("good-0", PROBE_WAIT).await;
    hold.rollback().await?;
    relay.stop().await?;
    assert!(
        probed.is_some(),
        "no probe while a row never tried was locked elsewhere: {:?}",
        downstream.calls()
    );
    Ok(())
}

/// A probe that draws a row the downstream refuses (a permanent failure: the row's fault, not
/// the downstream's) ends without a verdict: the next probe goes at once, not when the refused
/// probe's lease (a minute here) would have run out, and the healthy row behind it closes the
/// breaker.
#[tokio::test(flavor = "multi_thread")]
async fn a_probe_that_draws_a_refused_row_lets_the_next_probe_go_at_once() -> TestResult {
    let (_db, mut client, downstream, relay) = open_breaker_with_a_minute_lease().await?;
    pending(&mut client, "x", "poison-0").await?;
    pending(&mut client, "x", "good-0").await?;
    let refused = downstream.first_call("poison-0", PROBE_WAIT).await;
    let probed = downstream.first_call("good-0", PROBE_WAIT).await;
    relay.stop().await?;
    assert!(refused.is_some(), "the refused row was the first probe");
    assert!(
        probed.is_some(),
        "the healthy row waited for the refused probe's lease: {:?}",
        downstream.calls()
    );
    Ok(())
}

/// A destination the downstream throttles reads as open and throttled; one whose breaker is open
/// reads as open and not throttled; a paused one is paused whatever else holds it.
#[tokio::test(flavor = "multi_thread")]
async fn the_flow_view_tells_a_throttle_from_an_open_breaker() -> TestResult {
    let db = txoutbox_test_support::test_db().await?;
    let client = db.connect().await?;
    client
        .batch_execute(
            "INSERT INTO txoutbox_destinations (destination, throttled_until, throttle_reason) \
                 VALUES ('slow', now() + interval '1 minute', 'the downstream throttled'); \
             INSERT INTO txoutbox_destinations (destination, breaker, open_until, open_reason) \
                 VALUES ('down', 'open', now() + interval '1 minute', '10 consecutive failures'); \
             INSERT INTO txoutbox_destinations (destination, paused_at, paused_by, \
                     paused_reason, throttled_until) \
                 VALUES ('held', now(), 'ops', 'incident', now() + interval '1 minute')",
        )
        .await?;
    let flows = txoutbox::admin::destination_flows(&client).await?;
    let seen: Vec<(&str, &str, bool)> = flows
        .iter()
        .map(|f| (f.destination.as_str(), f.state.as_str(), f.throttled))
        .collect();
    assert_eq!(
        seen,
        [
            ("down", "open", false),
            ("held", "paused", false),
            ("slow", "open", true)
        ]
    );
    Ok(())
}

/// A probe that draws a row this relay cannot decode (dead-lettered without a call: the row's
/// fault) ends without a verdict too: the next probe goes at once, not when the undecodable
/// probe's lease (a minute here) would have run out.
#[tokio::test(flavor = "multi_thread")]
async fn a_probe_that_draws_an_undecodable_row_lets_the_next_probe_go_at_once() -> TestResult {
    let (db, mut client, downstream, relay) = open_breaker_with_a_minute_lease().await?;
    message(&db)
        .destination("x")
        .key("hostile")
        .stored_payload(&nested_too_deep())
        .create()
        .await?;
    pending(&mut client, "x", "good-0").await?;
    let probed = downstream.first_call("good-0", PROBE_WAIT).await;
    relay.stop().await?;
    assert_eq!(
        status(&client, "hostile").await?,
        Some(MessageStatus::Failed),
        "the undecodable row was dead-lettered"
    );
    assert!(
        probed.is_some(),
        "the healthy row waited for the undecodable probe's lease: {:?}",
        downstream.calls()
    );
    Ok(())
}

/// A probe whose call the relay's shutdown cuts short (given back, the downstream's answer
/// never heard) ends without a verdict: the next relay probes at once, not when the given-back
/// probe's lease (a minute here) would have run out.
#[tokio::test(flavor = "multi_thread")]
async fn a_probe_given_back_at_shutdown_lets_the_next_relay_probe_at_once() -> TestResult {
    let (db, mut client, downstream, relay) = open_breaker_with(
        relay_config()
            .with_lease(Duration::from_secs(60))
            .with_shutdown_grace(Duration::from_millis(200)),
    )
    .await?;
    pending(&mut client, "x", "hang-0").await?;
    let hung = downstream.first_call("hang-0", PROBE_WAIT).await;
    let report = relay.stop().await?;
    assert!(hung.is_some(), "the row that hangs was the probe");
    assert_eq!(
        report.released, 1,
        "the hung probe was given back at shutdown"
    );
    pending(&mut client, "x", "good-0").await?;
    let next = RunningRelay::start(
        db.relay()?
            .config(
                relay_config()
                    .with_lease(Duration::from_secs(60))
                    .with_shutdown_grace(Duration::from_millis(200)),
            )
            .sink("x", downstream.clone())
            .policy("x", one_second_breaker())
            .build()?,
    );
    let probed = downstream.first_call("good-0", PROBE_WAIT).await;
    next.stop().await?;
    assert!(
        probed.is_some(),
        "the next relay waited for the given-back probe's lease: {:?}",
        downstream.calls()
    );
    Ok(())
}
