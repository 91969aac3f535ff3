//! `txoutbox relay --metrics-addr`: what an operator sees without SQL. A real relay process
//! delivers to a real HTTP receiver; the tests scrape its endpoints over TCP.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

#[cfg(feature = "otel")]
use txoutbox::enqueue;
use txoutbox::{Begin, Fingerprint, IdempotencyKey, OutboxMessage, Scope};
use txoutbox_test_support::process::OwnedChild;
use txoutbox_test_support::process::{http_get, terminate, wait_for_get};
use txoutbox_test_support::prometheus::sample;
use txoutbox_test_support::request::enqueue_committed;
use txoutbox_test_support::request::{empty_created, new_claim};
#[cfg(feature = "otel")]
use txoutbox_test_support::select::column_pairs;
use txoutbox_test_support::webhook::WebhookReceiver;
use txoutbox_test_support::{
    eventually_some, free_addr, test_db, test_db_with_client, Cluster, TestDb,
};

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A relay process, killed when dropped (the tests stop it with SIGTERM first).
struct RelayProcess {
    child: OwnedChild,
    metrics: SocketAddr,
}

impl RelayProcess {
    async fn start(url: &str, extra: &[String]) -> anyhow::Result<Self> {
        Self::start_with_env(url, extra, &[]).await
    }

    async fn start_with_env(
        url: &str,
        extra: &[String],
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let metrics = free_addr()?;
        let child = Command::new(env!("CARGO_BIN_EXE_txoutbox"))
            .args([
                "relay",
                "--poll-interval",
                "100ms",
                "--retry-base",
                "50ms",
                "--retry-cap",
                "100ms",
                "--sample-interval",
                "100ms",
                "--metrics-addr",
                &metrics.to_string(),
            ])
            .args(extra)
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .spawn()?;
        let relay = RelayProcess {
            child: child.into(),
            metrics,
        };
        relay
            .wait_for("/healthz", |status, _| status == 200)
            .await?;
        Ok(relay)
    }

    /// Polls `path` until `done(status, body)` holds; returns that answer.
    async fn wait_for(
        &self,
        path: &str,
        done: impl Fn(u16, &str) -> bool,
    ) -> anyhow::Result<(u16, String)> {
        wait_for_get(self.metrics, path, done).await
    }

    fn terminate(mut self) -> anyhow::Result<Option<i32>> {
        terminate(&mut self.child)
    }
}

fn webhook_args(receiver: SocketAddr, destinations: &[&str]) -> Vec<String> {
    let mut args = vec!["--webhook-secret".to_owned(), SECRET.to_owned()];
    for d in destinations {
        args.push("--webhook".to_owned());
        args.push(format!("{d}=http://{receiver}/{d}"));
    }
    args
}

/// `txoutbox_messages_delivered_total` of `destination` in the scrape `body`.
fn delivered_total(body: &str, destination: &str) -> Option<f64> {
    sample(
        body,
        &format!(r#"txoutbox_messages_delivered_total{{destination="{destination}"}}"#),
    )
}

/// A test database, a webhook receiver failing each destination's first calls as `failing`
/// says, and a relay process delivering `destinations` to it.
async fn relay_to_a_receiver(
    failing: &[(&str, u32)],
    destinations: &[&str],
) -> anyhow::Result<(TestDb, WebhookReceiver, RelayProcess)> {
    let db = test_db().await?;
    let (receiver, addr) = WebhookReceiver::failing_first(failing).await?;
    let relay = RelayProcess::start(&db.url(), &webhook_args(addr, destinations)).await?;
    Ok((db, receiver, relay))
}

async fn enqueue_all(db: &TestDb, messages: Vec<OutboxMessage>) -> anyhow::Result<()> {
    let mut client = db.connect().await?;
    enqueue_committed(&mut client, &messages).await?;
    Ok(())
}

/// A Standard Webhooks event, as the webhook sink reads it.
fn webhook_payload(key: &str) -> serde_json::Value {
    serde_json::json!({ "event_type": "test.event", "data": { "key": key } })
}

fn message(destination: &str, key: &str) -> anyhow::Result<OutboxMessage> {
    Ok(OutboxMessage::new(destination, &webhook_payload(key))?.with_downstream_key(key))
}

#[tokio::test]
async fn metrics_count_deliveries_retries_and_dead_letters_by_destination() -> anyhow::Result<()> {
    let (db, receiver, relay) = relay_to_a_receiver(&[("flaky", 1)], &["hooks", "flaky"]).await?;
    enqueue_all(
        &db,
        vec![
            message("hooks", "h-1")?,
            message("hooks", "h-2")?,
            message("flaky", "f-1")?,
            // No sink is registered for this destination: a permanent failure.
            message("nowhere", "n-1")?,
        ],
    )
    .await?;
    let (_, scrape) = relay
        .wait_for("/metrics", |_, body| {
            delivered_total(body, "flaky") == Some(1.0)
                && delivered_total(body, "hooks") == Some(2.0)
                && sample(
                    body,
                    r#"txoutbox_messages_dead_lettered_total{destination="nowhere"}"#,
                ) == Some(1.0)
                && sample(body, "txoutbox_pending_messages") == Some(0.0)
        })
        .await?;
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_delivery_retries_total{destination="flaky"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_delivery_retries_total{destination="hooks"}"#
        ),
        Some(0.0),
        "hooks never failed: at 0 from start"
    );
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_delivery_latency_seconds_count{destination="hooks"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_attempt_duration_seconds_count{destination="flaky",outcome="retry"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_attempt_duration_seconds_count{destination="flaky",outcome="delivered"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&scrape, "txoutbox_oldest_pending_age_seconds"),
        Some(0.0)
    );
    assert!(scrape.contains("# HELP txoutbox_messages_delivered_total"));
    assert!(scrape.contains("# TYPE txoutbox_delivery_latency_seconds histogram"));
    assert_eq!(receiver.seen().len(), 4, "two hooks, and flaky twice");
    assert_eq!(relay.terminate()?, Some(0));
    Ok(())
}

#[tokio::test]
async fn every_relay_series_exists_at_zero_before_any_delivery() -> anyhow::Result<()> {
    let (_db, receiver, relay) = relay_to_a_receiver(&[], &["hooks", "mail"]).await?;
    let (_, scrape) = relay
        .wait_for("/metrics", |_, body| {
            sample(body, "txoutbox_leases_reclaimed_total").is_some()
        })
        .await?;
    let mut series = vec![
        "txoutbox_leases_reclaimed_total".to_owned(),
        "txoutbox_pending_messages".to_owned(),
        "txoutbox_oldest_pending_age_seconds".to_owned(),
    ];
    for d in ["hooks", "mail"] {
        for name in [
            "txoutbox_messages_enqueued_total",
            "txoutbox_messages_delivered_total",
            "txoutbox_delivery_retries_total",
            "txoutbox_messages_dead_lettered_total",
            "txoutbox_delivery_latency_seconds_count",
            "txoutbox_delivery_latency_seconds_sum",
        ] {
            series.push(format!(r#"{name}{{destination="{d}"}}"#));
        }
        for outcome in ["delivered", "retry", "failed", "unknown"] {
            series.push(format!(
                r#"txoutbox_attempt_duration_seconds_count{{destination="{d}",outcome="{outcome}"}}"#
            ));
        }
    }
    for name in &series {
        assert_eq!(sample(&scrape, name), Some(0.0), "{name} in {scrape}");
    }
    assert!(receiver.seen().is_empty(), "nothing was delivered");
    assert_eq!(relay.terminate()?, Some(0));
    Ok(())
}

#[tokio::test]
async fn the_idempotency_counters_of_declared_scopes_exist_at_zero() -> anyhow::Result<()> {
    let recorder = thread_recorder()?;
    let _recording = metrics::set_default_local_recorder(&recorder);
    let charges = Scope::new("tenant:1:charges")?.with_metric_label("charges");
    let refunds = Scope::new("refunds")?;
    txoutbox::telemetry::register_scopes([&charges, &refunds]);
    let scrape = recorder.handle().render();
    for scope in ["charges", "refunds"] {
        for name in [
            "txoutbox_idempotency_replays_total",
            "txoutbox_idempotency_mismatches_total",
            "txoutbox_idempotency_conflicts_total",
        ] {
            let series = format!(r#"{name}{{scope="{scope}"}}"#);
            assert_eq!(sample(&scrape, &series), Some(0.0), "{series} in {scrape}");
        }
    }
    assert!(!scrape.contains("tenant:"), "{scrape}");
    Ok(())
}

#[tokio::test]
async fn the_backlog_gauges_show_rows_waiting_for_a_stuck_destination() -> anyhow::Result<()> {
    let db = test_db().await?;
    // Always 503: the rows stay pending between retries.
    let (_receiver, addr) = WebhookReceiver::failing_first(&[("stuck", u32::MAX)]).await?;
    let relay = RelayProcess::start(&db.url(), &webhook_args(addr, &["stuck"])).await?;
    enqueue_all(
        &db,
        vec![message("stuck", "s-1")?, message("stuck", "s-2")?],
    )
    .await?;
    relay
        .wait_for("/metrics", |_, body| {
            sample(body, "txoutbox_pending_messages") == Some(2.0)
                && sample(
                    body,
                    r#"txoutbox_delivery_retries_total{destination="stuck"}"#,
                )
                .is_some_and(|n| n >= 4.0)
        })
        .await?;
    assert_eq!(relay.terminate()?, Some(0));
    Ok(())
}

#[tokio::test]
async fn readyz_is_503_while_postgres_is_down_and_200_when_it_is_back() -> anyhow::Result<()> {
    let (cluster, db) = Cluster::private_with_db().await?;
    let relay =
        RelayProcess::start(&db.url(), &["--stdout".to_owned(), "audit".to_owned()]).await?;
    relay.wait_for("/readyz", |status, _| status == 200).await?;
    cluster.stop()?;
    let (_, reason) = relay.wait_for("/readyz", |status, _| status == 503).await?;
    assert!(reason.starts_with("not ready"), "{reason:?}");
    let (status, _) = http_get(relay.metrics, "/healthz").await?;
    assert_eq!(
        status, 200,
        "the process is up even when the database is not"
    );
    cluster.start()?;
    relay.wait_for("/readyz", |status, _| status == 200).await?;
    assert_eq!(relay.terminate()?, Some(0));
    Ok(())
}

#[tokio::test]
async fn a_traceparent_given_at_enqueue_reaches_the_webhook_receiver() -> anyhow::Result<()> {
    let (db, receiver, relay) = relay_to_a_receiver(&[], &["direct", "request"]).await?;
    enqueue_all(
        &db,
        vec![message("direct", "d-1")?.with_traceparent(TRACEPARENT)?],
    )
    .await?;
    // Through an idempotent request: the claim's traceparent goes to every effect.
    let request_trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut client = db.connect().await?;
    let tx = client.transaction().await?;
    let key = IdempotencyKey::parse("request-0000000001")?;
    let mut claim = new_claim(
        &tx,
        &Scope::new("orders")?,
        &key,
        &Fingerprint::new("POST", "/orders", b"{}"),
    )
    .await?;
    claim.with_traceparent(request_trace)?;
    claim.enqueue(
        "notify",
        OutboxMessage::new("request", &webhook_payload("r-1"))?,
    )?;
    claim.complete(&tx, &empty_created()).await?;
    tx.commit().await?;

    eventually_some("both calls at the receiver", || async {
        Ok((receiver.seen().len() >= 2).then_some(()))
    })
    .await?;
    let mut seen = receiver.seen();
    seen.sort();
    let forwarded: Vec<(String, Option<txoutbox::telemetry::Traceparent>)> = seen
        .into_iter()
        .map(|(path, tp)| {
            (
                path,
                tp.and_then(|t| txoutbox::telemetry::Traceparent::parse(&t).ok()),
            )
        })
        .collect();
    // Each delivery is a span of its own in the enqueued trace: a new parent id.
    for (_, tp) in &forwarded {
        let parent = tp.as_ref().map(|t| t.parent_id());
        assert!(
            parent.is_some_and(|p| p != "00f067aa0ba902b7" && p != "b7ad6b7169203331"),
            "{forwarded:?}"
        );
    }
    let trace_ids: Vec<(String, Option<String>)> = forwarded
        .into_iter()
        .map(|(path, tp)| (path, tp.map(|t| t.trace_id().to_owned())))
        .collect();
    assert_eq!(
        trace_ids,
        [
            (
                "direct".to_owned(),
                Some("4bf92f3577b34da6a3ce929d0e0e4736".to_owned())
            ),
            (
                "request".to_owned(),
                Some("0af7651916cd43dd8448eb211c80319c".to_owned())
            ),
        ]
    );
    assert_eq!(relay.terminate()?, Some(0));
    Ok(())
}

/// Debian's libfaketime (package `libfaketime`), which shifts a process's clocks.
fn libfaketime() -> anyhow::Result<String> {
    let found = std::fs::read_dir("/usr/lib")?
        .filter_map(Result::ok)
        .map(|dir| dir.path().join("faketime/libfaketime.so.1"))
        .find(|path| path.exists());
    let path = found.ok_or_else(|| {
        anyhow::anyhow!("libfaketime.so.1 is not installed (Debian: apt-get install libfaketime)")
    })?;
    Ok(path.display().to_string())
}

#[tokio::test]
async fn a_relay_whose_clock_is_an_hour_ahead_records_times_on_the_database_clock(
) -> anyhow::Result<()> {
    let skew = [
        ("LD_PRELOAD", libfaketime()?),
        ("FAKETIME", "+1h".to_owned()),
    ];
    // The shift works on this machine: a process under it is an hour ahead.
    let shifted = Command::new("date")
        .arg("+%s")
        .envs(skew.iter().map(|(k, v)| (k, v)))
        .output()?;
    let shifted: i64 = String::from_utf8_lossy(&shifted.stdout).trim().parse()?;
    let now = chrono::Utc::now().timestamp();
    assert!(
        (shifted - now - 3600).abs() < 60,
        "date under libfaketime: {shifted}, now {now}"
    );

    let db = test_db().await?;
    let relay = RelayProcess::start_with_env(
        &db.url(),
        &["--stdout".to_owned(), "audit".to_owned()],
        &skew,
    )
    .await?;
    enqueue_all(&db, vec![message("audit", "skewed-1")?]).await?;
    let (_, scrape) = relay
        .wait_for("/metrics", |_, body| {
            delivered_total(body, "audit") == Some(1.0)
        })
        .await?;
    let latency = sample(
        &scrape,
        r#"txoutbox_delivery_latency_seconds_sum{destination="audit"}"#,
    );
    assert!(
        latency.is_some_and(|s| (0.0..60.0).contains(&s)),
        "commit to delivery took {latency:?} s"
    );
    let client = db.connect().await?;
    let row = client
        .query_one(
            "SELECT EXTRACT(EPOCH FROM a.finished_at - a.started_at)::float8, \
                    EXTRACT(EPOCH FROM d.delivered_at - d.created_at)::float8 \
             FROM txoutbox_attempts a JOIN txoutbox_delivered d ON d.id = a.message_id",
            &[],
        )
        .await?;
    for (what, seconds) in [
        ("the attempt", row.get::<_, f64>(0)),
        ("the delivery", row.get(1)),
    ] {
        assert!(
            (0.0..60.0).contains(&seconds),
            "{what} took {seconds} s by the recorded times"
        );
    }
    assert_eq!(relay.terminate()?, Some(0));
    Ok(())
}

#[test]
fn a_malformed_traceparent_is_refused_at_enqueue() -> anyhow::Result<()> {
    let message = OutboxMessage::new("direct", &1)?;
    assert!(message
        .clone()
        .with_traceparent("not-a-traceparent")
        .is_err());
    assert_eq!(message.traceparent(), None);
    Ok(())
}

/// A Prometheus recorder for the calling thread only: a `#[tokio::test]` runs on one thread, so
/// what it records is its own, whatever else runs in the process at the same time.
fn thread_recorder() -> anyhow::Result<txoutbox_axum::prometheus::PrometheusRecorder> {
    Ok(txoutbox_axum::prometheus::builder()?.build_recorder())
}

#[tokio::test]
async fn the_write_path_counts_enqueues_replays_mismatches_and_conflicts() -> anyhow::Result<()> {
    let recorder = thread_recorder()?;
    let _recording = metrics::set_default_local_recorder(&recorder);
    let prometheus = recorder.handle();
    let db = test_db().await?;
    enqueue_all(
        &db,
        vec![message("hooks", "w-1")?, message("hooks", "w-2")?],
    )
    .await?;
    // Enqueued again: deduplicated, not counted.
    enqueue_all(&db, vec![message("hooks", "w-1")?]).await?;
    // A batch over two destinations of which one row is a duplicate: each written row counts
    // under its own destination.
    enqueue_all(&db, vec![message("hooks", "w-2")?, message("mail", "m-1")?]).await?;

    let scope = Scope::new("orders")?.with_lock_timeout(Duration::from_millis(100))?;
    let key = IdempotencyKey::parse("request-0000000007")?;
    let body = Fingerprint::new("POST", "/orders", b"{}");
    let mut client = db.connect().await?;
    let tx = client.transaction().await?;
    let mut claim = new_claim(&tx, &scope, &key, &body).await?;
    claim.enqueue(
        "notify",
        OutboxMessage::new("request", &webhook_payload("r"))?,
    )?;
    // A concurrent request with the same key while the first holds it: a conflict.
    let mut other = db.connect().await?;
    let other_tx = other.transaction().await?;
    assert!(matches!(
        txoutbox::begin(&other_tx, &scope, &key, &body).await?,
        Begin::InFlight
    ));
    other_tx.rollback().await?;
    let response = empty_created();
    claim.complete(&tx, &response).await?;
    tx.commit().await?;
    for (fingerprint, expect_replay) in [
        (&body, true),
        (&Fingerprint::new("POST", "/x", b"1"), false),
    ] {
        let tx = client.transaction().await?;
        match txoutbox::begin(&tx, &scope, &key, fingerprint).await? {
            Begin::Replay(_) => assert!(expect_replay),
            Begin::Mismatch => assert!(!expect_replay),
            other => anyhow::bail!("unexpected {other:?}"),
        }
        tx.rollback().await?;
    }

    let scrape = prometheus.render();
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_messages_enqueued_total{destination="hooks"}"#
        ),
        Some(2.0),
        "{scrape}"
    );
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_messages_enqueued_total{destination="request"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_messages_enqueued_total{destination="mail"}"#
        ),
        Some(1.0),
        "{scrape}"
    );
    assert!(!scrape.contains(r#"destination="mixed""#), "{scrape}");
    for name in [
        "txoutbox_idempotency_replays_total",
        "txoutbox_idempotency_mismatches_total",
        "txoutbox_idempotency_conflicts_total",
    ] {
        assert_eq!(
            sample(&scrape, &format!(r#"{name}{{scope="orders"}}"#)),
            Some(1.0),
            "{name} in {scrape}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_scope_with_a_metric_label_is_counted_under_the_label() -> anyhow::Result<()> {
    let recorder = thread_recorder()?;
    let _recording = metrics::set_default_local_recorder(&recorder);
    let db = test_db().await?;
    let fingerprint = Fingerprint::new("POST", "/charge", b"{}");
    let response = empty_created();
    let mut client = db.connect().await?;
    // Two tenants' scopes, one label: each key is sent twice, the second time a replay.
    for tenant in ["tenant:1", "tenant:2"] {
        let scope = Scope::new(format!("{tenant}:charges"))?.with_metric_label("charges");
        let key = IdempotencyKey::parse("request-0000000001")?;
        for _ in 0..2 {
            let tx = client.transaction().await?;
            if let Begin::New(claim) = txoutbox::begin(&tx, &scope, &key, &fingerprint).await? {
                claim.complete(&tx, &response).await?;
            }
            tx.commit().await?;
        }
    }
    let scrape = recorder.handle().render();
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_idempotency_replays_total{scope="charges"}"#
        ),
        Some(2.0),
        "{scrape}"
    );
    assert!(!scrape.contains("tenant:"), "{scrape}");
    Ok(())
}

/// An OTLP/HTTP trace receiver (protobuf, as the OpenTelemetry Collector's `otlp` receiver takes
/// it on `/v1/traces`): decodes each export and keeps its spans.
#[cfg(feature = "otel")]
mod collector {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{header, StatusCode};
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message as _;

    /// One exported span, its ids in hex.
    #[derive(Debug, Clone)]
    pub struct ExportedSpan {
        pub service: Option<String>,
        pub name: String,
        pub trace_id: String,
        pub span_id: String,
        pub parent_span_id: String,
        pub attributes: Vec<(String, String)>,
    }

    impl ExportedSpan {
        pub fn attribute(&self, key: &str) -> Option<&str> {
            self.attributes
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        }
    }

    #[derive(Clone, Default)]
    pub struct Collector {
        spans: Arc<Mutex<Vec<ExportedSpan>>>,
    }

    impl Collector {
        pub async fn start() -> anyhow::Result<(Self, SocketAddr)> {
            let collector = Collector::default();
            let router = axum::Router::new()
                .route("/v1/traces", axum::routing::post(export))
                .with_state(collector.clone());
            let (addr, _) = txoutbox_test_support::serve_on_loopback(router).await?;
            Ok((collector, addr))
        }

        pub fn spans(&self) -> Vec<ExportedSpan> {
            self.spans.lock().map(|s| s.clone()).unwrap_or_default()
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn text(value: Option<&Value>) -> String {
        match value {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::BoolValue(b)) => b.to_string(),
            Some(Value::DoubleValue(d)) => d.to_string(),
            other => format!("{other:?}"),
        }
    }

    async fn export(
        State(collector): State<Collector>,
        body: Bytes,
    ) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
        let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
        let Ok(request) = ExportTraceServiceRequest::decode(body) else {
            return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
        };
        let mut exported = Vec::new();
        for resource_spans in request.resource_spans {
            let service = resource_spans.resource.as_ref().and_then(|r| {
                r.attributes
                    .iter()
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            });
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    exported.push(ExportedSpan {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| {
                                (
                                    kv.key.clone(),
                                    text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                                )
                            })
                            .collect(),
                    });
                }
            }
        }
        if let Ok(mut spans) = collector.spans.lock() {
            spans.extend(exported);
        }
        let response = ExportTraceServiceResponse::default().encode_to_vec();
        (StatusCode::OK, protobuf, response)
    }
}

#[cfg(feature = "otel")]
#[tokio::test]
async fn delivery_attempts_are_exported_as_spans_of_the_enqueued_trace() -> anyhow::Result<()> {
    let db = test_db().await?;
    // One 503 first: two attempts, two spans.
    let (receiver, addr) = WebhookReceiver::failing_first(&[("flaky", 1)]).await?;
    let (collector, otlp) = collector::Collector::start().await?;
    let relay = RelayProcess::start_with_env(
        &db.url(),
        &webhook_args(addr, &["flaky"]),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp}")),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ],
    )
    .await?;
    enqueue_all(
        &db,
        vec![message("flaky", "o-1")?.with_traceparent(TRACEPARENT)?],
    )
    .await?;
    let delivery_spans = || -> Vec<collector::ExportedSpan> {
        collector
            .spans()
            .into_iter()
            .filter(|s| s.name == "delivery")
            .collect()
    };
    eventually_some("both calls and both delivery spans", || async {
        Ok((receiver.seen().len() >= 2 && delivery_spans().len() >= 2).then_some(()))
    })
    .await?;
    let mut spans = delivery_spans();
    spans.sort_by_key(|s| s.attribute("attempt").map(str::to_owned));
    assert_eq!(spans.len(), 2, "{:?}", collector.spans());
    for (span, attempt) in spans.iter().zip(["1", "2"]) {
        assert_eq!(
            span.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736",
            "{span:?}"
        );
        assert_eq!(span.parent_span_id, "00f067aa0ba902b7", "{span:?}");
        assert_eq!(span.attribute("attempt"), Some(attempt), "{span:?}");
        assert_eq!(span.attribute("destination"), Some("flaky"), "{span:?}");
        assert_eq!(span.attribute("downstream_key"), Some("o-1"), "{span:?}");
        assert_eq!(span.service.as_deref(), Some("txoutbox-relay"));
    }
    // What the receiver was sent is the exported span of each attempt.
    let mut forwarded: Vec<String> = receiver
        .seen()
        .into_iter()
        .filter_map(|(_, tp)| tp)
        .collect();
    forwarded.sort();
    let mut expected: Vec<String> = spans
        .iter()
        .map(|s| format!("00-{}-{}-01", s.trace_id, s.span_id))
        .collect();
    expected.sort();
    assert_eq!(forwarded, expected);
    assert_eq!(relay.terminate()?, Some(0));
    Ok(())
}

#[cfg(feature = "otel")]
#[tokio::test]
async fn with_otel_the_current_span_is_the_context_stored_at_enqueue() -> anyhow::Result<()> {
    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use tracing::Instrument as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("service")));
    let _guard = tracing::subscriber::set_default(subscriber);
    let db = test_db().await?;
    let span = tracing::info_span!("POST /orders");
    let expected = {
        let context = span.context();
        let span_context = context.span().span_context().clone();
        format!(
            "00-{}-{}-01",
            span_context.trace_id(),
            span_context.span_id()
        )
    };
    let mut client = db.connect().await?;
    async {
        let tx = client.transaction().await?;
        let mut claim = new_claim(
            &tx,
            &Scope::new("orders")?,
            &IdempotencyKey::parse("request-otel-000001")?,
            &Fingerprint::new("POST", "/orders", b"{}"),
        )
        .await?;
        claim.enqueue(
            "notify",
            OutboxMessage::new("request", &webhook_payload("r"))?,
        )?;
        claim.complete(&tx, &empty_created()).await?;
        enqueue(&tx, &[message("direct", "in-span")?.with_current_trace()]).await?;
        tx.commit().await?;
        anyhow::Ok(())
    }
    .instrument(span)
    .await?;
    // Outside any span: nothing to attach.
    enqueue_all(
        &db,
        vec![message("direct", "no-span")?.with_current_trace()],
    )
    .await?;
    let stored: Vec<(String, Option<String>)> = column_pairs(
        &client,
        "SELECT destination, headers->>'traceparent' FROM txoutbox_messages ORDER BY seq",
    )
    .await?;
    assert_eq!(
        stored,
        [
            ("request".to_owned(), Some(expected.clone())),
            ("direct".to_owned(), Some(expected)),
            ("direct".to_owned(), None),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn the_relays_alive_gauge_counts_every_relay_whose_heartbeat_is_fresh() -> anyhow::Result<()>
{
    let (db, client) = test_db_with_client().await?;
    let (_receiver, addr) = WebhookReceiver::failing_first(&[]).await?;
    let mut args = webhook_args(addr, &["hooks"]);
    args.extend(["--heartbeat".to_owned(), "200ms".to_owned()]);
    let relay = RelayProcess::start(&db.url(), &args).await?;
    relay
        .wait_for("/metrics", |_, body| {
            sample(body, "txoutbox_relays_alive") == Some(1.0)
        })
        .await?;
    // Another relay beating, and one silent for an hour (stale: not counted).
    client
        .batch_execute(
            "INSERT INTO txoutbox_relays (owner, host, pid, version, heartbeat_every, heartbeat_at) \
             VALUES ('other', 'elsewhere', 7, '0.1.0', interval '1 hour', now()), \
                    ('gone', 'elsewhere', 8, '0.1.0', interval '5 s', now() - interval '1 hour')",
        )
        .await?;
    relay
        .wait_for("/metrics", |_, body| {
            sample(body, "txoutbox_relays_alive") == Some(2.0)
        })
        .await?;
    assert_eq!(relay.terminate()?, Some(0));
    Ok(())
}
