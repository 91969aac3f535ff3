//! The shipping service as it runs (`serve`, and the binary for the crash), fed by the relay's
//! real webhook sink over real HTTP: every delivery of one webhook is one shipment and one email;
//! a webhook that does not verify writes nothing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use shipping_service::{serve, CrashPoint, Settings};
use txoutbox::sink::{Delivery, Sink};
use txoutbox::standard_webhooks::{sign, unix_seconds, WebhookSecret};
use txoutbox_test_support::process::{service_command, wait_for_listener};
use txoutbox_test_support::relay::RunningRelay;
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::select::value;
use txoutbox_test_support::webhook::post_signed;
use txoutbox_test_support::{
    count, counts_for, free_addr, http_client, test_db, wait_until, TestDb,
};
use txoutbox_webhook::{Webhook, WebhookSink};

type TestResult = anyhow::Result<()>;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const NEW_SECRET: &str = "whsec_bmV3IHNlY3JldCBvZiB0aGUgc2hpcHBpbmcgc2VydmljZQ==";
const LIMIT: Duration = Duration::from_secs(30);

/// The service on its own database, served in-process until dropped.
struct Service {
    url: String,
    db: TestDb,
    stop: txoutbox::relay::Shutdown,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.trigger();
    }
}

/// Serves the shipping service (no relay: the tests count the email rows it enqueues).
async fn start(secrets: &[&str]) -> anyhow::Result<Service> {
    let db = test_db().await?;
    let addr = free_addr()?;
    let settings = Settings {
        database_url: db.url(),
        bind: addr,
        webhook_secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
        relay: false,
        crash_at: None,
    };
    let stop = txoutbox::relay::Shutdown::new();
    tokio::spawn(serve(settings, stop.wait()));
    wait_for_listener(addr).await?;
    Ok(Service {
        url: format!("http://{addr}/webhooks"),
        db,
        stop,
    })
}

fn secret(whsec: &str) -> anyhow::Result<WebhookSecret> {
    Ok(WebhookSecret::parse(whsec)?)
}

/// (shipments, email rows enqueued or delivered, inbox records) in the service's database.
async fn written(db: &TestDb) -> anyhow::Result<(i64, i64, i64)> {
    let client = db.connect().await?;
    let emails = counts_for(&client, "email").await?;
    Ok((
        count(&client, "shipments").await?,
        emails.hot() + emails.delivered,
        count(&client, "txoutbox_inbox").await?,
    ))
}

/// The charge service's `charge.succeeded` webhook as one relay attempt sees it.
fn charge_succeeded(charge: &str, webhook_id: &str) -> anyhow::Result<Delivery> {
    let message = Webhook::new(
        shipping_service::EVENT_TYPE,
        json!({"charge_id": charge, "email": "ada@example.org"}),
    )
    .into_outbox_message_for("webhook:shipping")?;
    Ok(Delivery {
        id: uuid::Uuid::now_v7(),
        destination: "webhook:shipping".into(),
        payload: message.payload().clone(),
        headers: BTreeMap::new(),
        downstream_key: webhook_id.into(),
        ordering_key: None,
        attempt: 1,
        created_at: chrono::Utc::now(),
    })
}

fn now() -> i64 {
    unix_seconds(SystemTime::now())
}

fn sink(url: &str, whsec: &str) -> anyhow::Result<WebhookSink> {
    Ok(WebhookSink::new(url, secret(whsec)?)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_webhook_delivered_five_times_is_one_shipment_and_one_email() -> TestResult {
    let service = start(&[SECRET]).await?;
    let sink = sink(&service.url, SECRET)?;
    let delivery = charge_succeeded("ch_5", "msg_five")?;
    for attempt in 1..=5 {
        let receipt = sink
            .deliver(&Delivery {
                attempt,
                ..delivery.clone()
            })
            .await;
        assert!(receipt.is_ok(), "attempt {attempt}: {receipt:?}");
    }
    assert_eq!(written(&service.db).await?, (1, 1, 1));
    // The inbox answered the redeliveries, not the shipments' unique charge id.
    let again = post_signed(
        &service.url,
        &secret(SECRET)?,
        "msg_five",
        now(),
        &event("ch_5"),
    )
    .await?;
    assert_eq!(again.status(), 200);
    let answer: Value = again.json().await?;
    assert_eq!(answer["duplicate"], true, "{answer}");
    let email: Value = value(
        &service.db.connect().await?,
        "SELECT payload FROM txoutbox_messages",
    )
    .await?;
    assert_eq!(email["to"], json!(["ada@example.org"]), "{email}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_webhook_delivered_fifty_times_at_once_is_one_shipment_and_one_email() -> TestResult
{
    let service = start(&[SECRET]).await?;
    let sink = std::sync::Arc::new(sink(&service.url, SECRET)?);
    let delivery = charge_succeeded("ch_50", "msg_fifty")?;
    let attempts = (0..50).map(|_| {
        let (sink, delivery) = (sink.clone(), delivery.clone());
        tokio::spawn(async move { sink.deliver(&delivery).await })
    });
    let mut delivered = 0;
    for answer in futures::future::join_all(attempts).await {
        match answer? {
            Ok(_) => delivered += 1,
            // A delivery that waited past the lock timeout is a 409: the relay retries it.
            Err(e) => assert!(e.to_string().contains("409"), "{e}"),
        }
    }
    assert!(delivered >= 1);
    // The relay's retry of whatever got a 409 is a duplicate.
    assert!(sink.deliver(&delivery).await.is_ok());
    assert_eq!(written(&service.db).await?, (1, 1, 1));
    Ok(())
}

fn event(charge: &str) -> String {
    json!({"type": "charge.succeeded", "data": {"charge_id": charge, "email": "ada@example.org"}})
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tampered_body_a_wrong_secret_or_a_timestamp_six_minutes_off_is_401_and_writes_nothing(
) -> TestResult {
    let service = start(&[SECRET]).await?;
    let key = secret(SECRET)?;
    let now = unix_seconds(SystemTime::now());
    let body = event("ch_1");
    let signature = sign(&key, "msg_1", now, body.as_bytes());
    let tampered = http_client()?
        .post(&service.url)
        .header("webhook-id", "msg_1")
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", signature)
        .body(event("ch_2"))
        .send()
        .await?;
    let answers = [
        ("tampered body", tampered),
        (
            "wrong secret",
            post_signed(&service.url, &secret(NEW_SECRET)?, "msg_1", now, &body).await?,
        ),
        (
            "6 min old",
            post_signed(&service.url, &key, "msg_1", now - 6 * 60, &body).await?,
        ),
        (
            "6 min ahead",
            post_signed(&service.url, &key, "msg_1", now + 6 * 60, &body).await?,
        ),
    ];
    for (what, answer) in answers {
        assert_eq!(answer.status(), 401, "{what}");
    }
    assert_eq!(written(&service.db).await?, (0, 0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_rotated_secret_the_old_and_the_new_are_accepted() -> TestResult {
    let service = start(&[NEW_SECRET, SECRET]).await?;
    let now = unix_seconds(SystemTime::now());
    let old = post_signed(&service.url, &secret(SECRET)?, "msg_1", now, &event("ch_1")).await?;
    assert_eq!(old.status(), 200);
    let new = post_signed(
        &service.url,
        &secret(NEW_SECRET)?,
        "msg_2",
        now,
        &event("ch_2"),
    )
    .await?;
    assert_eq!(new.status(), 200);
    assert_eq!(written(&service.db).await?, (2, 2, 2));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_event_is_422_and_another_event_type_is_acknowledged_once() -> TestResult {
    let service = start(&[SECRET]).await?;
    let key = secret(SECRET)?;
    let now = unix_seconds(SystemTime::now());
    let no_email = json!({"type": "charge.succeeded", "data": {"charge_id": "ch_1"}}).to_string();
    let nul =
        json!({"type": "charge.succeeded", "data": {"charge_id": "ch\u{0}1", "email": "a@b.c"}})
            .to_string();
    for (id, body) in [("msg_1", no_email), ("msg_2", nul)] {
        let answer = post_signed(&service.url, &key, id, now, &body).await?;
        assert_eq!(answer.status(), 422, "{body}");
    }
    let refunded = json!({"type": "charge.refunded", "data": {}}).to_string();
    for _ in 0..2 {
        let answer = post_signed(&service.url, &key, "msg_3", now, &refunded).await?;
        assert_eq!(answer.status(), 200);
    }
    assert_eq!(written(&service.db).await?, (0, 0, 1));
    Ok(())
}

/// The binary, killed (abort) after its commit and before its answer; restarted, it answers the
/// relay's redelivery with the same `webhook-id` as a duplicate (2xx): one shipment.
#[tokio::test(flavor = "multi_thread")]
async fn killed_after_commit_the_redelivery_with_the_same_id_is_a_duplicate() -> TestResult {
    let db = test_db().await?;
    let addr = free_addr()?;
    let url = format!("http://{addr}/webhooks");
    let mut crashing = child(&db, addr, Some(CrashPoint::AfterCommit))?;
    wait_for_listener(addr).await?;
    let sender = test_db().await?;
    let mut client = sender.connect().await?;
    let message = Webhook::new(
        shipping_service::EVENT_TYPE,
        json!({"charge_id": "ch_9", "email": "ada@example.org"}),
    )
    .into_outbox_message_for("webhook:shipping")?
    .with_downstream_key("charge-ch_9-shipping");
    enqueue_committed(&mut client, &[message]).await?;
    let sink = WebhookSink::with_config(
        &url,
        secret(SECRET)?,
        txoutbox_webhook::WebhookConfig {
            timeout: Duration::from_secs(2),
            ..Default::default()
        },
    )?;
    let relay = RunningRelay::start(
        sender
            .relay()?
            .policy(
                "webhook:shipping",
                txoutbox_test_support::relay::quick_retry(20),
            )
            .sink("webhook:shipping", sink)
            .build()?,
    );
    let status = tokio::time::timeout(LIMIT, crashing.wait()).await??;
    assert!(!status.success(), "the service died at its crash point");
    assert_eq!(written(&db).await?.0, 1, "the first attempt committed");
    let _restarted = child(&db, addr, None)?;
    assert_eq!(
        wait_until(&client, |c| c.delivered >= 1).await?.delivered,
        1
    );
    relay.stop().await?;
    let attempts: i32 = value(&client, "SELECT attempts FROM txoutbox_delivered").await?;
    assert!(attempts >= 2, "the kill cost an attempt: {attempts}");
    assert_eq!(written(&db).await?, (1, 1, 1));
    let id: String = value(
        &db.connect().await?,
        "SELECT message_id FROM txoutbox_inbox",
    )
    .await?;
    assert_eq!(id, "charge-ch_9-shipping");
    Ok(())
}

/// The service binary on `db` at `addr`, killed when dropped.
fn child(
    db: &TestDb,
    addr: SocketAddr,
    crash_at: Option<CrashPoint>,
) -> anyhow::Result<tokio::process::Child> {
    let env = [
        ("DATABASE_URL", db.url()),
        ("WEBHOOK_SECRET", SECRET.to_owned()),
        ("MAIL_DIR", std::env::temp_dir().display().to_string()),
    ];
    let exe = env!("CARGO_BIN_EXE_shipping-service");
    let mut command = service_command(exe, &addr.to_string(), env);
    command
        .env_remove("SMTP_URL")
        .stdout(std::process::Stdio::null());
    if let Some(point) = crash_at {
        command.env("CRASH_AT", point.as_str());
    }
    Ok(command.spawn()?)
}
