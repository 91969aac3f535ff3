//! The Standard Webhooks receiver (`SignedWebhook` + the inbox) over real HTTP on 127.0.0.1,
//! against a real Postgres, the relay's real webhook sink, and the official Python library.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use txoutbox::inbox::Consumer;
use txoutbox::standard_webhooks::{sign, unix_seconds, WebhookSecret};
use txoutbox::OutboxMessage;
use txoutbox_axum::{Problem, Received, SignedWebhook, WebhookReceiver};
use txoutbox_test_support::relay::RunningRelay;
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::select::value;
use txoutbox_test_support::webhook::post_signed;
use txoutbox_test_support::LoopbackServer;
use txoutbox_test_support::{count, http_client, test_db, wait_until, TestDb};

type TestResult = anyhow::Result<()>;

const OLD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const NEW_SECRET: &str = "whsec_bmV3IHNlY3JldCBvZiB0aGUgc2hpcHBpbmcgc2VydmljZQ==";

#[derive(Clone)]
struct App {
    pool: deadpool_postgres::Pool,
    webhooks: WebhookReceiver,
    /// Set: the next handler that commits dies before it answers (its connection dropped).
    die_after_commit: Arc<AtomicBool>,
}

impl FromRef<App> for WebhookReceiver {
    fn from_ref(app: &App) -> Self {
        app.webhooks.clone()
    }
}

/// The shipping service's handler: one shipment row and one "your order ships" email per
/// `charge.succeeded`, in one transaction with the inbox record.
async fn webhook(State(app): State<App>, hook: SignedWebhook) -> Result<Response, Problem> {
    let mut conn = app.pool.get().await?;
    let tx = conn.transaction().await?;
    let mut claim = match hook.receive(&tx).await? {
        Received::New(claim) => claim,
        Received::Duplicate(answer) => return Ok(answer),
    };
    let event: Value = hook.json()?;
    let charge = event["data"]["charge_id"].as_str().unwrap_or_default();
    tx.execute("INSERT INTO shipments (charge_id) VALUES ($1)", &[&charge])
        .await?;
    claim.enqueue(
        "ships-email",
        OutboxMessage::new("email", &json!({"to": event["data"]["email"]}))?,
    )?;
    claim.complete(&tx).await?;
    tx.commit().await?;
    if app.die_after_commit.swap(false, Ordering::SeqCst) {
        // Committed, and gone before answering: the connection closes with no response.
        std::panic::resume_unwind(Box::new("killed after commit, before the answer"));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

struct Service {
    // Declared first, so dropped (stopped) before the database.
    _server: LoopbackServer,
    url: String,
    db: TestDb,
    die_after_commit: Arc<AtomicBool>,
}

async fn start(webhooks: WebhookReceiver) -> anyhow::Result<Service> {
    let db = test_db().await?;
    db.connect()
        .await?
        .batch_execute("CREATE TABLE shipments (id bigserial PRIMARY KEY, charge_id text NOT NULL)")
        .await?;
    let die_after_commit = Arc::new(AtomicBool::new(false));
    let app = App {
        pool: db.pool(60)?,
        webhooks,
        die_after_commit: die_after_commit.clone(),
    };
    let router = Router::new()
        .route("/webhooks", post(webhook))
        .layer(DefaultBodyLimit::max(4096))
        .with_state(app);
    let server = LoopbackServer::start(router).await?;
    Ok(Service {
        url: format!("http://{}/webhooks", server.addr),
        db,
        die_after_commit,
        _server: server,
    })
}

fn receiver(secrets: &[&str]) -> WebhookReceiver {
    WebhookReceiver::from_whsec(
        Consumer::new("shipping").expect("valid"),
        secrets.iter().copied(),
    )
    .expect("valid secrets")
}

fn secret(whsec: &str) -> WebhookSecret {
    WebhookSecret::parse(whsec).expect("valid secret")
}

/// The service receiving webhooks signed with the old secret, and that secret to sign with.
async fn receiving_signed_with_the_old_secret() -> anyhow::Result<(Service, WebhookSecret)> {
    Ok((start(receiver(&[OLD_SECRET])).await?, secret(OLD_SECRET)))
}

fn event(charge: &str) -> String {
    json!({"type": "charge.succeeded", "data": {"charge_id": charge, "email": "a@example.com"}})
        .to_string()
}

fn now() -> i64 {
    unix_seconds(SystemTime::now())
}

async fn written(service: &Service) -> anyhow::Result<(i64, i64, i64)> {
    let client = service.db.connect().await?;
    Ok((
        count(&client, "shipments").await?,
        count(&client, "txoutbox_messages").await?,
        count(&client, "txoutbox_inbox").await?,
    ))
}

#[tokio::test]
async fn the_same_webhook_five_times_then_fifty_at_once_makes_one_shipment_and_one_email(
) -> TestResult {
    let (service, key) = receiving_signed_with_the_old_secret().await?;
    let body = event("ch_1");
    let ts = now();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            post_signed(&service.url, &key, "msg_1", ts, &body)
                .await?
                .status(),
        );
    }
    assert_eq!(statuses[0], 204);
    assert!(statuses[1..].iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(written(&service).await?, (1, 1, 1));

    let requests = (0..50).map(|_| post_signed(&service.url, &key, "msg_2", ts, &body));
    let answers = futures::future::join_all(requests).await;
    let mut new = 0;
    for answer in answers {
        let status = answer?.status();
        assert!(status.is_success(), "{status}");
        new += usize::from(status == 204);
    }
    assert_eq!(
        new, 1,
        "one delivery applied the message, 49 were duplicates"
    );
    assert_eq!(written(&service).await?, (2, 2, 2));
    Ok(())
}

#[tokio::test]
async fn tampered_wrong_secret_stale_or_future_webhooks_are_401_and_write_nothing() -> TestResult {
    let (service, key) = receiving_signed_with_the_old_secret().await?;
    let body = event("ch_1");
    let ts = now();
    let tampered = http_client()?
        .post(&service.url)
        .header("webhook-id", "msg_1")
        .header("webhook-timestamp", ts.to_string())
        .header(
            "webhook-signature",
            sign(&key, "msg_1", ts, body.as_bytes()),
        )
        .body(event("ch_2"))
        .send()
        .await?;
    let wrong_secret = post_signed(&service.url, &secret(NEW_SECRET), "msg_1", ts, &body).await?;
    let stale = post_signed(&service.url, &key, "msg_1", ts - 6 * 60, &body).await?;
    let ahead = post_signed(&service.url, &key, "msg_1", ts + 6 * 60, &body).await?;
    for (what, answer, kind) in [
        ("tampered", tampered, "signature"),
        ("wrong secret", wrong_secret, "signature"),
        ("6 min old", stale, "too old"),
        ("6 min ahead", ahead, "future"),
    ] {
        assert_eq!(answer.status(), 401, "{what}");
        assert_eq!(
            answer.headers()["content-type"],
            txoutbox_axum::PROBLEM_JSON,
            "{what}"
        );
        let problem: Value = answer.json().await?;
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(kind), "{what}: {detail}");
    }
    assert_eq!(written(&service).await?, (0, 0, 0));
    Ok(())
}

#[tokio::test]
async fn missing_headers_are_400_and_a_body_over_the_limit_is_413() -> TestResult {
    let (service, key) = receiving_signed_with_the_old_secret().await?;
    let unsigned = http_client()?
        .post(&service.url)
        .header("webhook-id", "msg_1")
        .header("webhook-timestamp", now().to_string())
        .body(event("ch_1"))
        .send()
        .await?;
    assert_eq!(unsigned.status(), 400);
    let problem: Value = unsigned.json().await?;
    assert!(problem["detail"]
        .as_str()
        .unwrap_or_default()
        .contains("webhook-signature"));
    let not_seconds = http_client()?
        .post(&service.url)
        .header("webhook-id", "msg_1")
        .header("webhook-timestamp", "yesterday")
        .header("webhook-signature", "v1,AAAA")
        .body(event("ch_1"))
        .send()
        .await?;
    assert_eq!(not_seconds.status(), 400);
    let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(10_000));
    let too_large = post_signed(&service.url, &key, "msg_1", now(), &huge).await?;
    assert_eq!(too_large.status(), 413);
    assert_eq!(written(&service).await?, (0, 0, 0));
    Ok(())
}

#[tokio::test]
async fn during_a_rotation_the_old_and_the_new_secret_are_both_accepted() -> TestResult {
    let service = start(receiver(&[NEW_SECRET, OLD_SECRET])).await?;
    let body = event("ch_1");
    let old = post_signed(&service.url, &secret(OLD_SECRET), "msg_1", now(), &body).await?;
    assert_eq!(old.status(), 204);
    let new = post_signed(&service.url, &secret(NEW_SECRET), "msg_2", now(), &body).await?;
    assert_eq!(new.status(), 204);
    assert_eq!(written(&service).await?.0, 2);
    Ok(())
}

/// The relay's own webhook sink delivers into the receiver: its signatures verify. The first
/// attempt commits and dies before it answers; the relay retries with the same `webhook-id`,
/// which is answered as a duplicate (2xx): one shipment, and the row is delivered.
#[tokio::test]
async fn the_relays_webhook_redelivered_after_a_kill_after_commit_is_one_shipment() -> TestResult {
    let service = start(receiver(&[OLD_SECRET])).await?;
    service.die_after_commit.store(true, Ordering::SeqCst);
    let sender = test_db().await?;
    let mut client = sender.connect().await?;
    let message = txoutbox_webhook::Webhook::new(
        "charge.succeeded",
        json!({"charge_id": "ch_9", "email": "a@example.com"}),
    )
    .into_outbox_message_for("webhook:shipping")?
    .with_downstream_key("charge-ch_9-shipping");
    enqueue_committed(&mut client, &[message]).await?;

    let config = txoutbox_webhook::WebhookConfig {
        timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let sink =
        txoutbox_webhook::WebhookSink::with_config(&service.url, secret(OLD_SECRET), config)?;
    let relay = RunningRelay::start(
        sender
            .relay()?
            .policy("webhook:shipping", quick_retry())
            .sink("webhook:shipping", sink)
            .build()?,
    );
    assert_eq!(
        wait_until(&client, |c| c.delivered >= 1).await?.delivered,
        1
    );
    relay.stop().await?;
    let attempts: i32 = value(&client, "SELECT attempts FROM txoutbox_delivered").await?;
    assert_eq!(attempts, 2, "the kill cost one attempt");
    assert_eq!(written(&service).await?, (1, 1, 1));
    let id: String = value(
        &service.db.connect().await?,
        "SELECT message_id FROM txoutbox_inbox",
    )
    .await?;
    assert_eq!(id, "charge-ch_9-shipping");
    Ok(())
}

fn quick_retry() -> txoutbox::relay::DestinationPolicy {
    txoutbox_test_support::relay::quick_retry(5)
}

/// A venv under the target directory with the official `standardwebhooks` package, or `None`
/// when pip cannot reach the registry.
fn python_with_standardwebhooks() -> anyhow::Result<Option<std::path::PathBuf>> {
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("standardwebhooks-venv");
    let python = venv.join("bin").join("python");
    let ready = |python: &std::path::Path| {
        std::process::Command::new(python)
            .args(["-c", "import standardwebhooks"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&python) {
        return Ok(Some(python));
    }
    let created = std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()?;
    anyhow::ensure!(created.success(), "python3 -m venv failed");
    let installed = std::process::Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", "standardwebhooks"])
        .status()?;
    if !installed.success() || !ready(&python) {
        return Ok(None);
    }
    Ok(Some(python))
}

const PYTHON: &str = r#"
import sys, json
from datetime import datetime, timezone
from standardwebhooks.webhooks import Webhook
secret, msg_id, ts, body, ours = sys.argv[1:6]
wh = Webhook(secret)
signature = wh.sign(msg_id, datetime.fromtimestamp(int(ts), tz=timezone.utc), body)
# Ours, checked by the official verifier (it raises when it does not verify).
wh.verify(body, {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": ours})
print(signature)
"#;

#[tokio::test]
async fn webhooks_signed_by_the_official_python_library_verify_and_ours_verify_there() -> TestResult
{
    let Some(python) = python_with_standardwebhooks()? else {
        eprintln!(
            "SKIPPED: pip could not install standardwebhooks (no registry?); \
             the interoperability check did not run"
        );
        return Ok(());
    };
    let service = start(receiver(&[OLD_SECRET])).await?;
    let body = event("ch_py");
    let ts = now();
    let ours = sign(&secret(OLD_SECRET), "msg_py", ts, body.as_bytes());
    let out = std::process::Command::new(python)
        .args([
            "-c",
            PYTHON,
            OLD_SECRET,
            "msg_py",
            &ts.to_string(),
            &body,
            &ours,
        ])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the official verifier refused our signature: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = String::from_utf8(out.stdout)?.trim().to_owned();
    let answer = http_client()?
        .post(&service.url)
        .header("webhook-id", "msg_py")
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", &theirs)
        .body(body)
        .send()
        .await?;
    assert_eq!(answer.status(), 204, "signature {theirs}");
    assert_eq!(written(&service).await?.0, 1);
    Ok(())
}
