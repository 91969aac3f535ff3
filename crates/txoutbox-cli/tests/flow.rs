//! Flow control per destination, end to end: real `txoutbox relay` processes deliver to a real
//! HTTP receiver that records when each call arrives and answers as its script says (429 with
//! Retry-After, 503 while "down", 200). Rate limits shared by two relays, a downstream's
//! Retry-After delaying its rows and, when it throttles every call, pausing its destination, the
//! circuit breaker, and an operator's pause and resume.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use txoutbox_test_support::factory::message;
use txoutbox_test_support::process::OwnedChild;
use txoutbox_test_support::select::{column, column_pairs, value};
use txoutbox_test_support::webhook::{Call, WebhookReceiver};
use txoutbox_test_support::{
    counts, counts_for, eventually_async, eventually_some, test_db, TestDb,
};

mod support;
use support::{ok, txoutbox as run};

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// A relay process, killed when dropped.
struct RelayProcess {
    _child: OwnedChild,
}

impl RelayProcess {
    fn start(
        db: &TestDb,
        receiver: SocketAddr,
        paths: &[&str],
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let mut args = vec![
            "relay".to_owned(),
            "--poll-interval".to_owned(),
            "100ms".to_owned(),
            "--webhook-secret".to_owned(),
            SECRET.to_owned(),
        ];
        for path in paths {
            args.push("--webhook".to_owned());
            args.push(format!("{path}=http://{receiver}/{path}"));
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Ok(Self {
            _child: txoutbox()
                .args(&args)
                .env("DATABASE_URL", db.url())
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()?
                .into(),
        })
    }
}

fn txoutbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_txoutbox"))
}

/// Enqueues `n` webhook rows to `destination`, keys `{destination}-{i}`.
async fn enqueue_rows(db: &TestDb, destination: &str, n: usize) -> anyhow::Result<()> {
    message(db)
        .destination(destination)
        .key(destination)
        .payload_with(
            |key, _| serde_json::json!({ "event_type": "test.event", "data": { "key": key } }),
        )
        .create_many(n)
        .await?;
    Ok(())
}

/// Every call delivered exactly once: as many distinct webhook ids delivered as rows.
fn delivered_once(calls: &[Call], rows: usize) {
    let delivered: Vec<&Call> = calls.iter().filter(|c| c.status == 200).collect();
    let ids: HashSet<&str> = delivered.iter().map(|c| c.webhook_id.as_str()).collect();
    assert_eq!(ids.len(), rows, "every row delivered");
    assert_eq!(delivered.len(), rows, "none delivered twice");
}

/// Waits (at most `limit`) until `rows` rows of `path` were delivered, and checks that each was
/// delivered once ([`delivered_once`]); every call `path` got.
async fn delivered_exactly_once(
    receiver: &WebhookReceiver,
    path: &str,
    rows: usize,
    limit: Duration,
) -> Vec<Call> {
    let delivered = receiver.wait_delivered(path, rows, limit).await;
    assert_eq!(delivered, rows, "{path}: rows delivered within {limit:?}");
    let calls = receiver.calls(path);
    delivered_once(&calls, rows);
    calls
}

#[tokio::test]
async fn two_relays_share_one_rate_limit() -> anyhow::Result<()> {
    let db = test_db().await?;
    let (receiver, addr) = WebhookReceiver::start(|_, _| (StatusCode::OK, None)).await?;
    enqueue_rows(&db, "webhook:x", 400).await?;
    let limit = ["--rate-limit", "webhook:*=20/s"];
    let _a = RelayProcess::start(&db, addr, &["webhook:x"], &limit)?;
    let _b = RelayProcess::start(&db, addr, &["webhook:x"], &limit)?;
    let calls = delivered_exactly_once(&receiver, "webhook:x", 400, Duration::from_secs(40)).await;
    let times: Vec<Duration> = calls.iter().map(|c| c.at).collect();
    let client = db.connect().await?;
    // At most 20 a second, +10 % (a burst of 2 tokens), over every 1 s window of the claims that
    // took the tokens: each delivered row's attempt start is its claim's time, by the database's
    // clock. (The receiver's arrival times are not the limiter's: a loaded machine schedules the
    // receiver's handlers late and in bunches.)
    let claimed: Vec<f64> = column(
        &client,
        "SELECT EXTRACT(EPOCH FROM attempt_started_at)::float8 FROM txoutbox_delivered \
         WHERE destination = 'webhook:x' ORDER BY 1",
    )
    .await?;
    assert_eq!(
        claimed.len(),
        400,
        "every delivered row carries its claim's time"
    );
    let busiest = claimed
        .iter()
        .map(|&t| claimed.iter().filter(|&&u| u >= t && u < t + 1.0).count())
        .max()
        .unwrap_or(0);
    assert!(busiest <= 22, "{busiest} rows claimed within one second");
    let span = times[times.len() - 1] - times[0];
    assert!(
        span >= Duration::from_secs(18),
        "400 rows at 20/s took {span:?}"
    );
    // The limit is shared, not taken by one relay while the other starves: each delivered its
    // share.
    let shares: Vec<(Option<String>, i64)> = column_pairs(
        &client,
        "SELECT relay, count(*)::int8 FROM txoutbox_delivered \
         WHERE destination = 'webhook:x' GROUP BY relay ORDER BY relay",
    )
    .await?;
    assert_eq!(shares.len(), 2, "rows delivered by relay: {shares:?}");
    assert!(
        shares.iter().all(|(_, n)| *n >= 40),
        "a relay delivered under a tenth of the rows: {shares:?}"
    );
    assert_eq!(
        counts(&client).await?.hot(),
        0,
        "nothing left behind, nothing dead-lettered"
    );
    Ok(())
}

#[tokio::test]
async fn a_downstream_throttling_every_call_pauses_the_whole_destination() -> anyhow::Result<()> {
    let db = test_db().await?;
    // 429 with Retry-After: 2 for the first 5 s, then 200.
    let (receiver, addr) =
        WebhookReceiver::failing_while(StatusCode::TOO_MANY_REQUESTS, Some(2), |_, since| {
            since < Duration::from_secs(5)
        })
        .await?;
    enqueue_rows(&db, "webhook:x", 100).await?;
    let _relay = RelayProcess::start(
        &db,
        addr,
        &["webhook:x"],
        &["--max-in-flight", "webhook:x=4"],
    )?;
    // While paused, the pause shows in `txoutbox stats`.
    eventually_some("the downstream's throttle in `txoutbox stats`", || async {
        let shown = ok(&db, &["stats"]).await?;
        Ok((shown.contains("FLOW CONTROL") && shown.contains("Retry-After")).then_some(()))
    })
    .await?;
    let calls = delivered_exactly_once(&receiver, "webhook:x", 100, Duration::from_secs(30)).await;
    // A row's next call comes no sooner than the Retry-After its last answer announced.
    for answer in calls.iter().filter(|c| c.status == 429) {
        let announced = Duration::from_secs(answer.retry_after.unwrap_or(0));
        let early: Vec<&Call> = calls
            .iter()
            .filter(|c| c.webhook_id == answer.webhook_id && c.at > answer.at)
            .filter(|c| c.at < answer.at + announced - Duration::from_millis(50))
            .collect();
        assert!(
            early.is_empty(),
            "called again before its Retry-After: {early:?}"
        );
    }
    // The destination paused: while the downstream throttled, no call for the Retry-After it
    // announced, though other rows were due.
    let storm: Vec<Duration> = calls
        .iter()
        .filter(|c| c.status == 429)
        .map(|c| c.at)
        .collect();
    let silence = storm
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .chain(
            calls
                .iter()
                .find(|c| c.status == 200)
                .and_then(|first| storm.last().map(|last| first.at.saturating_sub(*last))),
        )
        .max()
        .unwrap_or_default();
    assert!(
        silence >= Duration::from_millis(1900),
        "no pause while the downstream throttled every call: {storm:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_open_breaker_stops_calling_a_dead_destination_and_the_others_flow() -> anyhow::Result<()>
{
    let db = test_db().await?;
    // x is down for DOWN at least (the span the probes below are counted over), and until every
    // row of y is delivered: the order of events is the test's structure, so y must flow while x
    // is down, however slow the machine, and a y held back behind x never ends.
    const DOWN: Duration = Duration::from_secs(30);
    let started = Instant::now();
    let y_done = Arc::new(AtomicBool::new(false));
    let x_back = {
        let y_done = y_done.clone();
        move || y_done.load(Ordering::SeqCst) && started.elapsed() >= DOWN
    };
    let (receiver, addr) =
        WebhookReceiver::failing_while(StatusCode::SERVICE_UNAVAILABLE, None, move |path, _| {
            path == "webhook:x" && !x_back()
        })
        .await?;
    enqueue_rows(&db, "webhook:x", 20).await?;
    let _relay = RelayProcess::start(
        &db,
        addr,
        &["webhook:x", "webhook:y"],
        &[
            "--max-in-flight",
            "webhook:x=2",
            "--breaker-cool-down",
            "2s",
            "--retry-base",
            "100ms",
            "--retry-cap",
            "1s",
            "--max-attempts",
            "50",
        ],
    )?;
    // y's rows come once x's breaker is open, so they flow past it.
    let client = db.connect().await?;
    eventually_async("x's breaker opens", || async {
        let open: i64 = value(
            &client,
            "SELECT count(*)::int8 FROM txoutbox_destinations \
             WHERE destination = 'webhook:x' AND breaker = 'open'",
        )
        .await?;
        Ok(open == 1)
    })
    .await?;
    enqueue_rows(&db, "webhook:y", 1000).await?;
    // A hang guard, not a bound on speed: y blocked behind x never ends, as x stays down.
    let y = receiver
        .wait_delivered("webhook:y", 1000, Duration::from_secs(120))
        .await;
    assert_eq!(
        y, 1000,
        "the other destination is delivered while x is down"
    );
    y_done.store(true, Ordering::SeqCst);
    let x = receiver
        .wait_delivered("webhook:x", 20, DOWN + Duration::from_secs(60))
        .await;
    assert_eq!(x, 20, "every row of x delivered after it came back");
    delivered_once(&receiver.calls("webhook:x"), 20);
    delivered_once(&receiver.calls("webhook:y"), 1000);
    let failures: Vec<Call> = receiver
        .calls("webhook:x")
        .into_iter()
        .filter(|c| c.status == 503)
        .collect();
    // It opens after 10 consecutive failures (2 more may have been on their way); then at most
    // one probe per cool-down (2 s, 4 s, 8 s, 16 s: at most 4 probes in 30 s).
    assert!(failures.len() >= 10, "{} failures", failures.len());
    let (burst, probes) = failures.split_at(failures.len().min(12));
    assert!(
        probes.len() <= 4,
        "{} calls to x after the breaker opened: {probes:?}",
        probes.len()
    );
    let mut previous = burst.last().map(|c| c.at).unwrap_or_default();
    for probe in probes {
        assert!(
            probe.at >= previous + Duration::from_millis(1800),
            "a probe {:?} after the last call: {probes:?}",
            probe.at - previous
        );
        previous = probe.at;
    }
    let attempts: i64 = value(
        &client,
        "SELECT max(attempts)::int8 FROM txoutbox_delivered WHERE destination = 'webhook:x'",
    )
    .await?;
    assert!(
        attempts <= 8,
        "rows of an open destination spend no attempt ({attempts})"
    );
    Ok(())
}

/// With one call in flight, the failure that opens the breaker is the last call: the slot it
/// frees is refilled only by a claim that already sees the breaker open, however busy the claim
/// loop is with another destination's backlog.
#[tokio::test]
async fn the_failure_that_opens_the_breaker_is_the_last_call_before_the_cool_down(
) -> anyhow::Result<()> {
    let db = test_db().await?;
    let (receiver, addr) =
        WebhookReceiver::failing_while(StatusCode::SERVICE_UNAVAILABLE, None, |path, _| {
            path == "webhook:x"
        })
        .await?;
    enqueue_rows(&db, "webhook:x", 10).await?;
    enqueue_rows(&db, "webhook:y", 3000).await?;
    let _relay = RelayProcess::start(
        &db,
        addr,
        &["webhook:x", "webhook:y"],
        &[
            "--max-in-flight",
            "webhook:x=1",
            "--breaker-failures",
            "3",
            "--breaker-cool-down",
            "1m",
            "--retry-base",
            "1ms",
            "--retry-cap",
            "1ms",
        ],
    )?;
    let y = receiver
        .wait_delivered("webhook:y", 3000, Duration::from_secs(40))
        .await;
    assert_eq!(y, 3000, "the other destination is delivered");
    let calls = receiver.calls("webhook:x");
    assert_eq!(
        calls.len(),
        3,
        "calls to x while its breaker cools down: {calls:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_operator_pauses_and_resumes_a_destination_for_every_relay() -> anyhow::Result<()> {
    let db = test_db().await?;
    let (receiver, addr) = WebhookReceiver::start(|_, _| (StatusCode::OK, None)).await?;
    let paths = ["webhook:x", "webhook:y"];
    let _a = RelayProcess::start(&db, addr, &paths, &[])?;
    let _b = RelayProcess::start(&db, addr, &paths, &[])?;
    ok(
        &db,
        &[
            "pause",
            "webhook:x",
            "--reason",
            "receiver incident",
            "--by",
            "alice",
            // No row names the destination yet: its rows come after the pause.
            "--force",
        ],
    )
    .await?;
    enqueue_rows(&db, "webhook:x", 20).await?;
    enqueue_rows(&db, "webhook:y", 20).await?;
    assert_eq!(
        receiver
            .wait_delivered("webhook:y", 20, Duration::from_secs(15))
            .await,
        20
    );
    // A row enqueued after all of them is delivered too: the relays claimed again since, and
    // still nothing reaches the paused destination.
    message(&db)
        .destination("webhook:y")
        .key("webhook:y-later")
        .payload(serde_json::json!({ "event_type": "test.event", "data": {} }))
        .create()
        .await?;
    assert_eq!(
        receiver
            .wait_delivered("webhook:y", 21, Duration::from_secs(15))
            .await,
        21
    );
    assert_eq!(
        receiver.calls("webhook:x").len(),
        0,
        "the paused destination is not called"
    );
    let shown = ok(&db, &["stats"]).await?;
    assert!(
        shown.contains("paused by alice") && shown.contains("receiver incident"),
        "{shown}"
    );
    let client = db.connect().await?;
    assert_eq!(counts_for(&client, "webhook:x").await?.pending, 20);
    let waiting: Vec<(i32, Option<String>)> = column_pairs(
        &client,
        "SELECT attempts, lease_owner FROM txoutbox_messages WHERE destination = 'webhook:x'",
    )
    .await?;
    assert_eq!(
        waiting,
        vec![(0, None); 20],
        "paused rows wait unleased and spend no attempt"
    );

    ok(&db, &["resume", "webhook:x", "--by", "bob"]).await?;
    delivered_exactly_once(&receiver, "webhook:x", 20, Duration::from_secs(15)).await;
    let log: Vec<(String, String)> = column_pairs(
        &client,
        "SELECT outcome, error FROM txoutbox_attempts \
             WHERE message_id IS NULL AND destination = 'webhook:x' ORDER BY finished_at",
    )
    .await?;
    assert_eq!(
        log,
        [
            (
                "paused".to_owned(),
                "receiver incident (by alice)".to_owned()
            ),
            ("resumed".to_owned(), "by bob".to_owned()),
        ]
    );
    // Resuming what is not paused is one clear line and exit 1.
    let again = run(&db, &["resume", "webhook:x"]).await?;
    assert_eq!(again.status.code(), Some(1));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("is not paused") && err.trim().lines().count() == 1,
        "{err}"
    );
    Ok(())
}

#[test]
fn a_rate_limit_that_matches_no_sink_or_does_not_parse_is_refused() {
    let unmatched = txoutbox()
        .args(["relay", "--stdout", "audit", "--rate-limit", "stripe=80/s"])
        .env("DATABASE_URL", "postgres://x@127.0.0.1:1/x")
        .output()
        .expect("runs");
    assert_eq!(unmatched.status.code(), Some(1));
    let err = String::from_utf8_lossy(&unmatched.stderr);
    assert!(err.contains("--rate-limit stripe: no destination"), "{err}");
    for bad in ["stripe=fast", "stripe=0/s", "stripe=80", "=80/s"] {
        let out = txoutbox()
            .args(["relay", "--stdout", "stripe", "--rate-limit", bad])
            .env("DATABASE_URL", "postgres://x@127.0.0.1:1/x")
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}

/// The destination's row in `txoutbox_destinations`, if any: (paused).
async fn paused(db: &TestDb, destination: &str) -> anyhow::Result<Option<bool>> {
    let client = db.connect().await?;
    Ok(client
        .query_opt(
            "SELECT paused_at IS NOT NULL FROM txoutbox_destinations WHERE destination = $1",
            &[&destination],
        )
        .await?
        .map(|r| r.get(0)))
}

#[tokio::test]
async fn a_pause_of_a_destination_nothing_names_exits_2_with_the_known_ones_and_pauses_nothing(
) -> anyhow::Result<()> {
    let db = test_db().await?;
    message(&db).destination("stripe").create().await?;
    message(&db).destination("email").create().await?;
    let out = run(&db, &["pause", "emial", "--reason", "SMTP incident"]).await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(r#"destination "emial""#)
            && err.contains("closest first: email, stripe")
            && err.contains("--force"),
        "{err}"
    );
    assert_eq!(paused(&db, "emial").await?, None);
    assert_eq!(paused(&db, "email").await?, None);
    Ok(())
}

#[tokio::test]
async fn a_forced_pause_pauses_a_destination_before_its_first_row() -> anyhow::Result<()> {
    let db = test_db().await?;
    ok(
        &db,
        &["pause", "sms", "--reason", "not live yet", "--force"],
    )
    .await?;
    assert_eq!(paused(&db, "sms").await?, Some(true));
    Ok(())
}

#[tokio::test]
async fn a_resume_of_a_destination_nothing_names_exits_2_with_the_known_ones() -> anyhow::Result<()>
{
    let db = test_db().await?;
    message(&db).destination("email").create().await?;
    let out = run(&db, &["resume", "emial"]).await?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("closest first: email"), "{err}");
    Ok(())
}
