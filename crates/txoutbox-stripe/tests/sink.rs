//! The Stripe sink behind the real relay, on a real Postgres, against the fake Stripe API:
//! the forwarded key is Stripe's Idempotency-Key, so crashes and retries create one object.

use std::time::Duration;

use tokio_postgres::Client;
use txoutbox::admin::MessageStatus;
use txoutbox::{sink::Sink, OutboxMessage};
use txoutbox_stripe::{NewPaymentIntent, NewRefund, StripeRequest, StripeSink, DESTINATION};
use txoutbox_test_support::abort_after_a_call;
use txoutbox_test_support::fake_stripe::FakeStripe;
use txoutbox_test_support::relay::{
    assert_lease_must_hold_the_timeout, quick_retry, short_lease, RunningRelay,
};
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::select::value;
use txoutbox_test_support::{eventually_some, status, test_db, TestDb};

type TestResult = anyhow::Result<()>;

fn sink(fake: &FakeStripe) -> anyhow::Result<StripeSink> {
    Ok(StripeSink::new(fake.secret_key())?.with_api_base(fake.base_url())?)
}

fn relay_with(db: &TestDb, sink: impl Sink, max_attempts: u32) -> anyhow::Result<RunningRelay> {
    Ok(RunningRelay::start(
        db.relay()?
            .sink(DESTINATION, sink)
            .policy(DESTINATION, quick_retry(max_attempts))
            .build()?,
    ))
}

fn charge(payment_method: &str) -> NewPaymentIntent {
    NewPaymentIntent::new(2000, "usd")
        .with_customer("cus_test_1")
        .with_payment_method(payment_method)
        .with_metadata("order_id", "42")
        .with_description("Order 42")
}

async fn enqueue(client: &mut Client, message: OutboxMessage, key: &str) -> anyhow::Result<()> {
    enqueue_committed(client, &[message.with_downstream_key(key)]).await?;
    Ok(())
}

/// The delivered row's (receipt, attempts), once it is delivered.
/// Enqueues a charge of the test card under downstream key `key`.
async fn enqueue_visa_charge(client: &mut Client, key: &str) -> anyhow::Result<()> {
    enqueue(client, charge("pm_card_visa").into_outbox_message()?, key).await
}

/// A test database, a fake Stripe, and a client on the database.
async fn db_and_fake_stripe() -> anyhow::Result<(TestDb, FakeStripe, Client)> {
    let (db, fake) = (test_db().await?, FakeStripe::start().await?);
    let client = db.connect().await?;
    Ok((db, fake, client))
}

async fn delivered(client: &Client, key: &str) -> anyhow::Result<(String, i32)> {
    eventually_some(&format!("{key} delivered"), || async {
        let row = client
            .query_opt(
                "SELECT receipt, attempts FROM txoutbox_delivered WHERE downstream_key = $1",
                &[&key],
            )
            .await?;
        Ok(row.map(|row| (row.get(0), row.get(1))))
    })
    .await
}

/// The dead-lettered row's (attempts, last_error), once it is dead-lettered.
async fn dead_lettered(client: &Client, key: &str) -> anyhow::Result<(i32, String)> {
    eventually_some(&format!("{key} dead-lettered"), || async {
        let row = client
            .query_opt(
                "SELECT attempts, last_error FROM txoutbox_messages \
                 WHERE downstream_key = $1 AND status = 'failed'",
                &[&key],
            )
            .await?;
        Ok(row.map(|row| {
            (
                row.get(0),
                row.get::<_, Option<String>>(1).unwrap_or_default(),
            )
        }))
    })
    .await
}

#[tokio::test]
async fn intent_is_created_with_the_forwarded_key_and_its_id_is_the_receipt() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    enqueue_visa_charge(&mut client, "order-42-charge").await?;
    let relay = relay_with(&db, sink(&fake)?, 5)?;

    let (receipt, attempts) = delivered(&client, "order-42-charge").await?;
    relay.stop().await?;
    assert_eq!(attempts, 1);
    let intents = fake.intents();
    assert_eq!(intents.len(), 1);
    assert_eq!(intents[0]["id"], receipt.as_str());
    assert!(receipt.starts_with("pi_"), "{receipt}");
    assert_eq!(intents[0]["status"], "succeeded");
    assert_eq!(intents[0]["amount"], 2000);
    assert_eq!(intents[0]["customer"], "cus_test_1");
    assert_eq!(intents[0]["metadata"]["order_id"], "42");
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].idempotency_key.as_deref(),
        Some("order-42-charge")
    );
    assert_eq!(requests[0].param("confirm"), Some("true"));
    Ok(())
}

#[tokio::test]
async fn relay_crash_after_stripe_created_the_intent_yields_exactly_one_intent() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    enqueue_visa_charge(&mut client, "order-7-charge").await?;
    abort_after_a_call(&db, DESTINATION, sink(&fake)?, |relay| {
        relay.policy(DESTINATION, quick_retry(5))
    })
    .await?;
    assert_eq!(fake.intents().len(), 1);
    let left = status(&client, "order-7-charge").await?;
    assert!(
        matches!(left, Some(MessageStatus::Pending | MessageStatus::InFlight)),
        "the row is still undelivered after the crash: {left:?}"
    );

    let second = RunningRelay::start(
        db.relay()?
            .config(short_lease())
            // Requests that fit in the 1 s lease (the relay refuses the default 20 s).
            .sink(
                DESTINATION,
                sink(&fake)?.with_timeout(Duration::from_millis(500)),
            )
            .policy(DESTINATION, quick_retry(5))
            .build()?,
    );
    let (receipt, attempts) = delivered(&client, "order-7-charge").await?;
    second.stop().await?;

    assert_eq!(
        fake.created_count(),
        1,
        "the redelivery created nothing new"
    );
    assert_eq!(
        receipt,
        fake.intents()[0]["id"].as_str().unwrap_or_default()
    );
    assert_eq!(attempts, 2);
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests
        .iter()
        .all(|r| r.idempotency_key.as_deref() == Some("order-7-charge")));
    assert!(!requests[0].replayed);
    assert!(
        requests[1].replayed,
        "the second request is Stripe's idempotent replay"
    );
    Ok(())
}

#[tokio::test]
async fn declined_card_is_dead_lettered_at_once_with_stripes_code() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    let message = charge("pm_card_chargeDeclined").into_outbox_message()?;
    enqueue(&mut client, message, "order-9-charge").await?;
    let relay = relay_with(&db, sink(&fake)?, 5)?;

    let (attempts, last_error) = dead_lettered(&client, "order-9-charge").await?;
    relay.stop().await?;
    assert_eq!(attempts, 1, "a declined card is not retried");
    assert!(
        last_error.starts_with("card_declined: Your card was declined."),
        "{last_error}"
    );
    assert!(last_error.contains("generic_decline"), "{last_error}");
    assert_eq!(fake.requests().len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_raw_payload_stripe_would_refuse_is_dead_lettered_naming_the_builder() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    // No `type` tag: not a request the sink knows how to send.
    let untagged = serde_json::json!({"amount": 2000, "currency": "usd", "customer": "cus_1"});
    enqueue(
        &mut client,
        OutboxMessage::new(DESTINATION, &untagged)?,
        "raw-1",
    )
    .await?;
    // The right shape, an amount Stripe refuses: refused before any call.
    let zero = serde_json::json!({"type": "create_payment_intent", "amount": 0,
                                  "currency": "usd", "customer": "cus_1"});
    enqueue(
        &mut client,
        OutboxMessage::new(DESTINATION, &zero)?,
        "raw-2",
    )
    .await?;
    let relay = relay_with(&db, sink(&fake)?, 5)?;

    let (attempts, untagged_error) = dead_lettered(&client, "raw-1").await?;
    let (_, zero_error) = dead_lettered(&client, "raw-2").await?;
    relay.stop().await?;
    assert_eq!(attempts, 1, "a malformed payload is not retried");
    let named = "malformed payload (build it with txoutbox_stripe::NewPaymentIntent or \
                 txoutbox_stripe::NewRefund): ";
    assert!(untagged_error.starts_with(named), "{untagged_error}");
    assert!(
        zero_error.starts_with(named) && zero_error.contains("at least 1"),
        "{zero_error}"
    );
    assert!(fake.requests().is_empty(), "Stripe was not called");
    Ok(())
}

#[tokio::test]
async fn stripe_500_is_retried_with_the_same_key_then_delivered() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    fake.fail_next(500, 2);
    enqueue_visa_charge(&mut client, "order-5-charge").await?;
    let relay = relay_with(&db, sink(&fake)?, 5)?;

    let (receipt, attempts) = delivered(&client, "order-5-charge").await?;
    relay.stop().await?;
    assert_eq!(attempts, 3);
    let statuses: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [500, 500, 200]);
    assert!(fake
        .requests()
        .iter()
        .all(|r| r.idempotency_key.as_deref() == Some("order-5-charge")));
    assert_eq!(fake.intents().len(), 1);
    assert_eq!(
        receipt,
        fake.intents()[0]["id"].as_str().unwrap_or_default()
    );
    Ok(())
}

#[tokio::test]
async fn stripe_429_is_retried_after_its_retry_after_then_delivered() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    fake.fail_next_with_retry_after(429, 1, Duration::from_secs(1));
    enqueue_visa_charge(&mut client, "order-6-charge").await?;
    // Retry-After is honoured up to the policy's cap: give this one room for Stripe's second.
    let mut retry_after_policy = quick_retry(5);
    retry_after_policy.retry.cap = Duration::from_secs(5);
    let relay = RunningRelay::start(
        db.relay()?
            .sink(DESTINATION, sink(&fake)?)
            .policy(DESTINATION, retry_after_policy)
            .build()?,
    );

    let (_, attempts) = delivered(&client, "order-6-charge").await?;
    relay.stop().await?;
    assert_eq!(attempts, 2);
    assert_eq!(fake.intents().len(), 1);
    // The relay's own backoff is at most 200 ms here: a longer wait is Stripe's Retry-After.
    let gap: f64 = value(
        &client,
        "SELECT extract(epoch FROM (max(started_at) - min(finished_at)))::float8 \
             FROM txoutbox_attempts WHERE downstream_key = 'order-6-charge'",
    )
    .await?;
    assert!(
        gap >= 0.9,
        "the retry came {gap:.3} s after the 429, before its Retry-After"
    );
    Ok(())
}

#[tokio::test]
async fn timed_out_request_is_retried_with_the_same_key_and_creates_one_intent() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    // Stripe takes 1.5 s; the sink gives up after 0.3 s and retries while the first request is
    // still running (409 key in use), then gets the first request's intent replayed.
    fake.set_latency(Duration::from_millis(1500));
    enqueue_visa_charge(&mut client, "order-8-charge").await?;
    let impatient = sink(&fake)?.with_timeout(Duration::from_millis(300));
    let relay = relay_with(&db, impatient, 20)?;

    let (receipt, attempts) = delivered(&client, "order-8-charge").await?;
    relay.stop().await?;
    assert!(attempts >= 2, "{attempts}");
    assert_eq!(fake.created_count(), 1);
    assert_eq!(
        receipt,
        fake.intents()[0]["id"].as_str().unwrap_or_default()
    );
    let requests = fake.requests();
    assert!(requests.iter().any(|r| r.status == 409), "{requests:?}");
    assert!(requests.last().is_some_and(|r| r.replayed));
    let first_error: Option<String> = value(
        &client,
        "SELECT error FROM txoutbox_attempts WHERE downstream_key = 'order-8-charge' \
             ORDER BY started_at LIMIT 1",
    )
    .await?;
    assert!(
        first_error.is_some_and(|e| e.starts_with("no answer from Stripe")),
        "the first attempt timed out"
    );
    Ok(())
}

#[tokio::test]
async fn reused_key_with_other_parameters_is_dead_lettered_as_idempotency_error() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    // Someone already used the key for a different charge.
    let earlier =
        StripeRequest::from(NewPaymentIntent::new(1000, "usd").with_payment_method("pm_card_visa"));
    sink(&fake)?.send(&earlier, "order-3-charge").await?;
    enqueue_visa_charge(&mut client, "order-3-charge").await?;
    let relay = relay_with(&db, sink(&fake)?, 5)?;

    let (attempts, last_error) = dead_lettered(&client, "order-3-charge").await?;
    relay.stop().await?;
    assert_eq!(attempts, 1);
    assert!(last_error.starts_with("idempotency_error"), "{last_error}");
    assert!(last_error.contains("different parameters"), "{last_error}");
    assert_eq!(fake.intents().len(), 1, "the second charge was not made");
    Ok(())
}

#[tokio::test]
async fn wrong_secret_key_is_dead_lettered_with_stripes_message() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    enqueue_visa_charge(&mut client, "order-4-charge").await?;
    let wrong = StripeSink::new("sk_test_not_the_fakes_key")?.with_api_base(fake.base_url())?;
    let relay = relay_with(&db, wrong, 5)?;

    let (attempts, last_error) = dead_lettered(&client, "order-4-charge").await?;
    relay.stop().await?;
    assert_eq!(attempts, 1);
    assert!(
        last_error.contains("Invalid API Key provided"),
        "{last_error}"
    );
    assert!(last_error.contains("401"), "{last_error}");
    assert_eq!(fake.created_count(), 0);
    Ok(())
}

#[tokio::test]
async fn refund_of_a_delivered_intent_is_created_with_its_own_key() -> TestResult {
    let (db, fake, mut client) = db_and_fake_stripe().await?;
    let relay = relay_with(&db, sink(&fake)?, 5)?;
    enqueue_visa_charge(&mut client, "order-2-charge").await?;
    let (intent, _) = delivered(&client, "order-2-charge").await?;

    let refund = NewRefund::new(&intent)
        .with_amount(500)
        .with_metadata("reason", "damaged")
        .into_outbox_message()?;
    enqueue(&mut client, refund, "order-2-refund").await?;
    let (receipt, attempts) = delivered(&client, "order-2-refund").await?;
    relay.stop().await?;

    assert_eq!(attempts, 1);
    assert!(receipt.starts_with("re_"), "{receipt}");
    let refunds = fake.refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["id"], receipt.as_str());
    assert_eq!(refunds[0]["payment_intent"], intent.as_str());
    assert_eq!(refunds[0]["amount"], 500);
    assert_eq!(refunds[0]["metadata"]["reason"], "damaged");
    let refund_request = fake
        .requests()
        .into_iter()
        .find(|r| r.path == "/v1/refunds")
        .map(|r| r.idempotency_key);
    assert_eq!(refund_request, Some(Some("order-2-refund".to_owned())));
    Ok(())
}

#[test]
fn a_relay_whose_lease_cannot_hold_the_request_timeout_is_refused() -> TestResult {
    // Building a relay connects to nothing: no database or Stripe is needed to be refused.
    let sink = StripeSink::new("sk_test_timeout")?;
    assert_eq!(sink.timeout(), Some(txoutbox_stripe::DEFAULT_TIMEOUT));
    let fitting = sink.clone().with_timeout(Duration::from_secs(5));
    assert_eq!(fitting.timeout(), Some(Duration::from_secs(5)));
    assert_lease_must_hold_the_timeout(DESTINATION, "Stripe timeout", sink, fitting)?;
    Ok(())
}
