//! The dashboard over real HTTP: the router nested under `/outbox` of a server on loopback,
//! against a database of each test's own.

use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde_json::{json, Value};
use tokio_postgres::Client;
use txoutbox::admin::MessageStatus;
use txoutbox::{
    sink::DeliveryError, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse,
};
use txoutbox_dashboard::{DashboardConfig, User};
use txoutbox_test_support::factory::{message, pending_ordered};
use txoutbox_test_support::relay::{RecordingSink, RunningRelay, ScriptedSink};
use txoutbox_test_support::request::{enqueue_committed, new_claim};
use txoutbox_test_support::select::value_with;
use txoutbox_test_support::{
    downstream_key_of, row_status, test_db, test_db_with_client, test_db_with_sql, wait_for_row,
    TestDb,
};
use uuid::Uuid;

mod support;
use support::Served;

type TestResult = anyhow::Result<()>;

/// The dashboard served on loopback, nested under `/outbox`.
struct Dashboard {
    base: String,
    http: reqwest::Client,
    _served: Served,
}

impl Dashboard {
    async fn start(db: &TestDb, config: DashboardConfig) -> anyhow::Result<Self> {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let served = Served::start(db, config).await?;
        Ok(Self {
            base: format!("http://{}/outbox", served.addr),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
            _served: served,
        })
    }

    /// A request as `user`.
    fn request(&self, method: Method, path: &str, user: Login) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match user {
            Some((name, password)) => req.basic_auth(name, Some(password)),
            None => req,
        }
    }

    /// A POST as `user`, marked as sent from another site.
    fn cross_site(&self, path: &str, user: Login) -> reqwest::RequestBuilder {
        self.request(Method::POST, path, user)
            .header("sec-fetch-site", "cross-site")
    }

    /// A request with no body, as `user`.
    async fn send(&self, method: Method, path: &str, user: Login) -> anyhow::Result<Response> {
        Ok(self.request(method, path, user).send().await?)
    }

    /// POST a JSON body as `user`.
    async fn post_json(&self, path: &str, body: &Value, user: Login) -> anyhow::Result<Response> {
        Ok(self
            .request(Method::POST, path, user)
            .json(body)
            .send()
            .await?)
    }

    /// The API's pause of `destination` for `reason`, as `user`.
    async fn api_pause(
        &self,
        destination: &str,
        reason: &str,
        user: Login,
    ) -> anyhow::Result<Response> {
        let path = format!("/api/destinations/{destination}/pause");
        self.post_json(&path, &json!({ "reason": reason }), user)
            .await
    }

    /// POST an encoded form as `user`, with this `Origin` header.
    async fn form_from(
        &self,
        path: &str,
        form: &'static str,
        origin: &str,
        user: Login,
    ) -> anyhow::Result<Response> {
        Ok(self
            .request(Method::POST, path, user)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("origin", origin)
            .body(form)
            .send()
            .await?)
    }

    /// GET as `user`: (status, body).
    async fn get_as(&self, path: &str, user: Login) -> anyhow::Result<(StatusCode, String)> {
        let res = self.request(Method::GET, path, user).send().await?;
        Ok((res.status(), res.text().await?))
    }

    /// Fails unless GET `path` as `user` answers `status`; names the body when it does not.
    async fn assert_get(&self, path: &str, user: Login, status: u16) -> TestResult {
        let (got, body) = self.get_as(path, user).await?;
        assert_eq!(got, status, "GET {path}: {body}");
        Ok(())
    }

    /// GET that must answer 200; the body.
    async fn page(&self, path: &str) -> anyhow::Result<String> {
        let (status, body) = self.get_as(path, None).await?;
        anyhow::ensure!(status == StatusCode::OK, "GET {path}: {status}: {body}");
        Ok(body)
    }

    async fn api(&self, path: &str) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.page(path).await?)?)
    }

    /// POST a form as `user`: (status, body).
    async fn post_form(
        &self,
        path: &str,
        form: &[(&str, &str)],
        user: Login,
    ) -> anyhow::Result<(StatusCode, String)> {
        let body = form_body(form);
        let res = self
            .request(Method::POST, path, user)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("sec-fetch-site", "same-origin")
            .body(body)
            .send()
            .await?;
        Ok((res.status(), res.text().await?))
    }

    /// POST an action's form with its `reason` alone, as `user`: (status, body).
    async fn post_reason(
        &self,
        path: &str,
        reason: &str,
        user: Login,
    ) -> anyhow::Result<(StatusCode, String)> {
        self.post_form(path, &[("reason", reason)], user).await
    }

    /// The overview's pause form of the destination at `path` (its name, percent-encoded) with
    /// `reason`, as `user`: (status, body).
    async fn form_pause(
        &self,
        path: &str,
        reason: &str,
        user: Login,
    ) -> anyhow::Result<(StatusCode, String)> {
        self.post_reason(&format!("/destinations/{path}/pause"), reason, user)
            .await
    }

    /// POST the list form with the rows `ids` selected and the fields `extra`, as `user`:
    /// (status, body).
    async fn post_selection(
        &self,
        path: &str,
        ids: &[Uuid],
        extra: &[(&str, &str)],
        user: Login,
    ) -> anyhow::Result<(StatusCode, String)> {
        let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let mut form: Vec<(&str, &str)> = ids.iter().map(|id| ("ids", id.as_str())).collect();
        form.extend_from_slice(extra);
        self.post_form(path, &form, user).await
    }
}

fn form_body(form: &[(&str, &str)]) -> String {
    form.iter()
        .map(|(k, v)| format!("{k}={}", v.replace(' ', "+")))
        .collect::<Vec<_>>()
        .join("&")
}

fn users() -> anyhow::Result<DashboardConfig> {
    Ok(DashboardConfig {
        users: vec![
            User::parse("alice:op-secret:operator")?,
            User::parse("victor:view-secret:viewer")?,
        ],
        ..DashboardConfig::default()
    })
}

/// A user's name and password for basic auth, or none.
type Login = Option<(&'static str, &'static str)>;

const ALICE: Login = Some(("alice", "op-secret"));
const VICTOR: Login = Some(("victor", "view-secret"));

/// A pending row to `destination` with downstream key `key` and an empty payload.
async fn pending_empty(client: &mut Client, destination: &str, key: &str) -> anyhow::Result<Uuid> {
    message(client)
        .destination(destination)
        .key(key)
        .payload(json!({}))
        .create()
        .await
}

/// A [`pending_empty`] row for each `(destination, downstream key)` of `rows`, in order; their
/// ids.
async fn pending_rows<const N: usize>(
    client: &mut Client,
    rows: [(&str, &str); N],
) -> anyhow::Result<[Uuid; N]> {
    let mut ids = [Uuid::nil(); N];
    for (id, (destination, key)) in ids.iter_mut().zip(rows) {
        *id = pending_empty(client, destination, key).await?;
    }
    Ok(ids)
}

/// Puts a row where a relay's permanent failure would: failed, with its error and attempt.
async fn fail(client: &Client, id: Uuid, error: &str) -> TestResult {
    settle(client, id, "failed", error).await
}

/// Gives row `id` the end state `status` (`failed`, `unknown`) after one attempt that ended with
/// `error`, as the relay would.
async fn settle(client: &Client, id: Uuid, status: &str, error: &str) -> TestResult {
    client
        .execute(
            "UPDATE txoutbox_messages SET status = $3, attempts = 1, last_error = $2, \
                 attempt_started_at = now() WHERE id = $1",
            &[&id, &error, &status],
        )
        .await?;
    client
        .execute(
            "INSERT INTO txoutbox_attempts (message_id, attempt, downstream_key, relay, outcome, \
                 error, started_at) \
             SELECT id, 1, downstream_key, 'relay-1', $3, $2, now() \
             FROM txoutbox_messages WHERE id = $1",
            &[&id, &error, &status],
        )
        .await?;
    Ok(())
}

async fn status_of(client: &Client, id: Uuid) -> anyhow::Result<String> {
    let status = row_status(client, id).await?;
    Ok(status.map_or_else(|| "gone".to_owned(), |s| s.to_string()))
}

/// Fails unless every row of `ids` is `status` (`why` says what the test expects of them).
async fn assert_all(client: &Client, ids: &[Uuid], status: &str, why: &str) -> TestResult {
    for id in ids {
        assert_eq!(status_of(client, *id).await?, status, "{id}: {why}");
    }
    Ok(())
}

/// Whether the page `html` links to the page of row `id`.
fn links_row(html: &str, id: Uuid) -> bool {
    html.contains(&format!("/outbox/messages/{id}\""))
}

fn ids_in(rows: &Value) -> Vec<String> {
    rows.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// pages

/// Asserts `res` is a 400 whose problem's `error` contains `says`; the problem, for more checks.
async fn bad_request(res: Response, says: &str) -> anyhow::Result<Value> {
    assert_eq!(
        res.status(),
        StatusCode::BAD_REQUEST,
        "expected a 400 saying {says:?}"
    );
    let problem: Value = res.json().await?;
    assert!(
        problem["error"].as_str().is_some_and(|e| e.contains(says)),
        "{problem}"
    );
    Ok(problem)
}

#[tokio::test]
async fn overview_counts_rows_by_destination_and_state() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending_empty(&mut client, "email", "e-1").await?;
    pending_empty(&mut client, "email", "e-2").await?;
    let failed = pending_empty(&mut client, "stripe", "s-1").await?;
    fail(&client, failed, "card declined").await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;

    let html = dash.page("").await?;
    assert!(
        html.contains(r#"destination=email&amp;status=pending">2</a>"#),
        "{html}"
    );
    // A failed (or unknown) count above zero stands out; a zero does not.
    assert!(
        html.contains(
            r#"<td class="num alarm"><a href="/outbox/messages?destination=stripe&amp;status=failed">1</a>"#
        ),
        "{html}"
    );
    assert!(
        html.contains(
            r#"<td class="num"><a href="/outbox/messages?destination=email&amp;status=failed">0</a>"#
        ),
        "{html}"
    );
    assert!(
        html.contains(
            r#"<td class="num"><a href="/outbox/messages?destination=stripe&amp;status=unknown">0</a>"#
        ),
        "{html}"
    );
    assert!(html.contains("Top failing destinations"));
    assert!(
        html.contains(r#"href="/outbox/messages?status=failed&amp;destination=stripe">stripe</a>"#),
        "{html}"
    );
    assert!(html.contains("<svg"), "charts are inline SVG");
    Ok(())
}

#[tokio::test]
async fn overview_counts_the_requests_whose_effects_wait_for_the_fan_out() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;
    let waiting = "Requests whose effects wait on their key rows";
    assert!(!dash.page("").await?.contains(waiting));
    // A key row of a scope with deferred effects, as `Claim::complete` stores it.
    client
        .batch_execute(
            "INSERT INTO txoutbox_idempotency_keys (scope, key, fingerprint, state, \
                 response_status, response_headers, response_body, expires_at, effects) \
             VALUES ('orders', 'key-with-effects', '\\x00', 'completed', 201, '[]', '', \
                 now() + interval '1 day', '[]')",
        )
        .await?;
    let html = dash.page("").await?;
    assert!(html.contains(waiting), "{html}");
    assert!(html.contains("<strong>1</strong>"), "{html}");
    Ok(())
}

#[tokio::test]
async fn the_overview_warns_when_rows_wait_and_no_relay_is_alive() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;
    let alarm = "No relay is alive";
    let html = dash.page("").await?;
    assert!(!html.contains(alarm), "nothing waits: {html}");
    assert!(html.contains("No relay alive"), "{html}");

    pending_empty(&mut client, "email", "e-1").await?;
    // A relay that stopped beating an hour ago.
    client
        .batch_execute(
            "INSERT INTO txoutbox_relays (owner, host, pid, version, heartbeat_every, heartbeat_at) \
             VALUES ('gone', 'box', 7, '0.1.0', interval '5 s', now() - interval '1 hour')",
        )
        .await?;
    let html = dash.page("").await?;
    assert!(html.contains(alarm), "{html}");
    assert!(
        html.contains("1 row(s) wait for delivery (1 relay(s) stopped sending heartbeats)"),
        "{html}"
    );
    assert!(html.contains(r#"href="/outbox/relays""#), "{html}");

    // One relay beating: no alarm.
    client
        .batch_execute(
            "INSERT INTO txoutbox_relays (owner, host, pid, version, heartbeat_every) \
             VALUES ('alive', 'box', 8, '0.1.0', interval '1 hour')",
        )
        .await?;
    let html = dash.page("").await?;
    assert!(!html.contains(alarm), "{html}");
    assert!(html.contains("1 relay alive"), "{html}");
    let relays: Value = dash
        .get_as("/api/relays", None)
        .await
        .map(|(_, body)| serde_json::from_str(&body))??;
    assert_eq!(relays[0]["owner"], "alive");
    assert_eq!(relays[1]["stale"], true);
    Ok(())
}

#[tokio::test]
async fn the_overview_charts_the_last_hour_day_or_week_with_axes() -> TestResult {
    // Deliveries 30 min, 5 h and 3 days ago.
    let (db, _) = test_db_with_sql(
        "INSERT INTO txoutbox_delivered (id, seq, destination, payload, headers, downstream_key, \
                 attempts, created_at, delivered_at) \
             SELECT gen_random_uuid(), g, 'email', '{}', '{}', 'k-' || g, 1, \
                 now() - a - interval '2 seconds', now() - a \
             FROM unnest(ARRAY[interval '30 minutes', interval '5 hours', interval '3 days']) \
                 WITH ORDINALITY AS t(a, g)",
    )
    .await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;
    for (window, heading, bars, delivered) in [
        ("", "The last 1 h", 60, 1),
        ("?window=1h", "The last 1 h", 60, 1),
        ("?window=24h", "The last 24 h", 96, 2),
        ("?window=7d", "The last 7 d", 168, 3),
    ] {
        let html = dash.page(window).await?;
        assert!(html.contains(heading), "{window}: {html}");
        let activity = html
            .split(r#"<section id="activity""#)
            .nth(1)
            .and_then(|rest| rest.split("</section>").next())
            .unwrap_or_default();
        assert_eq!(
            activity.matches(r#"<rect class="ok""#).count(),
            bars,
            "{window}"
        );
        assert!(
            activity.contains(&format!(": {delivered} in ")),
            "{window}: {activity}"
        );
        // Value labels and five time ticks on every chart.
        assert_eq!(
            activity.matches(r#"<text class="time""#).count(),
            15,
            "{window}"
        );
        assert!(activity.contains(r#"<text class="value""#), "{window}");
        // The choice of span, the current one marked; only the last hour refreshes live.
        assert!(activity.contains(r#"aria-current="true">"#), "{activity}");
        assert_eq!(
            activity.starts_with(" data-live"),
            heading.ends_with("1 h"),
            "{window}"
        );
    }
    dash.assert_get("?window=1y", None, 400).await?;
    Ok(())
}

#[tokio::test]
async fn every_page_answers_200_under_the_mount_prefix() -> TestResult {
    let db = test_db().await?;
    let id = message(&db)
        .destination("email")
        .key("e-1")
        .payload(json!({"to": "x"}))
        .create()
        .await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;
    for path in [
        "",
        "/messages",
        &format!("/messages/{id}"),
        "/failures",
        "/relays",
        "/keys",
        "/assets/dashboard.css",
        "/assets/live.js",
    ] {
        let (status, body) = dash.get_as(path, None).await?;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        if path.is_empty() || !path.starts_with("/assets") {
            assert!(
                body.contains(r#"href="/outbox/assets/dashboard.css""#),
                "{path}"
            );
        }
    }
    dash.assert_get("/messages/not-an-id", None, 404).await?;
    let unknown = format!("/messages/{}", Uuid::now_v7());
    dash.assert_get(&unknown, None, 404).await?;
    Ok(())
}

#[tokio::test]
async fn message_filters_narrow_the_list() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let email = pending_ordered(&mut client, "email", "e-1", "order-7").await?;
    let stripe = pending_empty(&mut client, "stripe", "s-1").await?;
    let declined = pending_empty(&mut client, "stripe", "s-2").await?;
    fail(&client, stripe, "500 upstream timeout").await?;
    fail(&client, declined, "402 card declined").await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;

    let all = dash.page("/messages").await?;
    assert!(
        [email, stripe, declined]
            .iter()
            .all(|id| links_row(&all, *id)),
        "{all}"
    );
    let cases: [(&str, Vec<Uuid>); 6] = [
        ("status=failed", vec![stripe, declined]),
        ("status=pending", vec![email]),
        ("destination=email", vec![email]),
        ("error=CARD+DECLINED", vec![declined]),
        ("key=s-1", vec![stripe]),
        ("ordering_key=order-7", vec![email]),
    ];
    for (query, want) in cases {
        let html = dash.page(&format!("/messages?{query}")).await?;
        for id in [email, stripe, declined] {
            assert_eq!(links_row(&html, id), want.contains(&id), "{query}: {id}");
        }
    }
    let html = dash
        .page("/messages?since=1h&until=2099-01-01T00:00:00Z")
        .await?;
    assert!(links_row(&html, email));
    let html = dash.page("/messages?until=1h").await?;
    assert!(!links_row(&html, email), "enqueued less than an hour ago");
    dash.assert_get("/messages?since=yesterday", None, 400)
        .await?;
    Ok(())
}

#[tokio::test]
async fn pagination_is_stable_while_rows_are_inserted() -> TestResult {
    let db = test_db().await?;
    let mut first: Vec<String> = message(&db)
        .destination("email")
        .key("old")
        .payload(json!({}))
        .create_many(7)
        .await?
        .iter()
        .map(Uuid::to_string)
        .collect();
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;

    let mut seen = Vec::new();
    let mut path = "/api/messages?limit=3".to_owned();
    for _ in 0..10 {
        let rows = dash.api(&path).await?;
        let ids = ids_in(&rows);
        // New rows arrive between pages: none of them shows up on a later page.
        message(&db)
            .destination("email")
            .key(&format!("new-{}", seen.len()))
            .payload(json!({}))
            .create()
            .await?;
        seen.extend(ids.clone());
        let Some(cursor) = rows
            .as_array()
            .and_then(|a| a.last())
            .and_then(|r| r["cursor"].as_str())
        else {
            break;
        };
        if ids.len() < 3 {
            break;
        }
        path = format!("/api/messages?limit=3&before={cursor}");
    }
    first.reverse();
    assert_eq!(seen, first, "every row once, newest first");

    // The HTML list pages the same way: its "Older" link carries the cursor.
    let html = dash.page("/messages?limit=3").await?;
    assert!(
        html.contains(r#"rel="next" href="/outbox/messages?before="#),
        "{html}"
    );
    Ok(())
}

#[tokio::test]
async fn message_page_shows_payload_headers_keys_trace_link_and_attempts() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let message = OutboxMessage::new("stripe", &json!({"amount": 1200, "currency": "eur"}))?
        .with_downstream_key("pay-1")
        .with_ordering_key("cust-9")
        .with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")?;
    let id = message.id();
    enqueue_committed(&mut client, &[message]).await?;
    fail(&client, id, "402 card declined").await?;
    let dash = Dashboard::start(
        &db,
        DashboardConfig {
            trace_url: Some("https://traces.example/trace/{trace_id}".into()),
            ..DashboardConfig::default()
        },
    )
    .await?;

    let html = dash.page(&format!("/messages/{id}")).await?;
    for expected in [
        "<details open><summary>{2 fields}</summary>",
        "amount: </span><code>1200</code>",
        "pay-1",
        "cust-9",
        r#"href="https://traces.example/trace/4bf92f3577b34da6a3ce929d0e0e4736""#,
        "traceparent",
        "relay-1",
        "402 card declined",
        "Replay with a new key",
    ] {
        assert!(html.contains(expected), "{expected}: {html}");
    }
    Ok(())
}

#[tokio::test]
async fn failures_are_grouped_by_destination_and_normalised_error() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let [a, b, c, d] = pending_rows(
        &mut client,
        [
            ("stripe", "s-1"),
            ("stripe", "s-2"),
            ("stripe", "s-3"),
            ("email", "e-1"),
        ],
    )
    .await?;
    fail(
        &client,
        a,
        "card 4242 declined for charge 0191e7a2-1c3b-7d40-8e5f-0a1b2c3d4e5f",
    )
    .await?;
    fail(
        &client,
        b,
        "card 1111 declined for charge 0191e7a2-aaaa-7d40-8e5f-0a1b2c3d4e5f",
    )
    .await?;
    fail(&client, c, "500 internal error").await?;
    fail(
        &client,
        d,
        "card 4242 declined for charge 0191e7a2-1c3b-7d40-8e5f-0a1b2c3d4e5f",
    )
    .await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;

    let html = dash.page("/failures").await?;
    let group = "card &lt;n&gt; declined for charge &lt;uuid&gt;";
    assert_eq!(
        html.matches(&format!(r#"<td class="error">{group}"#))
            .count(),
        2,
        "one group per destination: {html}"
    );
    assert!(
        html.contains(r#"error_class=card+%3Cn%3E+declined+for+charge+%3Cuuid%3E">2</a>"#),
        "{html}"
    );
    assert!(
        html.contains(r#"<td class="error">500 internal error"#),
        "{html}"
    );
    assert!(html.contains("Replay this group"));

    // The group's link lists exactly its rows.
    let list = dash
        .page("/messages?status=failed&destination=stripe&error_class=card+%3Cn%3E+declined+for+charge+%3Cuuid%3E")
        .await?;
    for (id, listed) in [(a, true), (b, true), (c, false), (d, false)] {
        assert_eq!(links_row(&list, id), listed, "{id}");
    }
    Ok(())
}

#[tokio::test]
async fn keys_page_finds_an_inbox_record_and_what_its_handler_enqueued() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let consumer = txoutbox::inbox::Consumer::new("shipping")?;
    let tx = client.transaction().await?;
    let txoutbox::inbox::Receive::New(mut claim) =
        txoutbox::inbox::receive(&tx, &consumer, "msg_2aBc").await?
    else {
        anyhow::bail!("a new message");
    };
    let email = OutboxMessage::new("email", &json!({"email": "bob@example.com"}))?;
    let email_id = email.id();
    claim.enqueue("ships-email", email)?;
    claim.complete(&tx).await?;
    tx.commit().await?;
    let dash = Dashboard::start(
        &db,
        DashboardConfig {
            effects: vec!["ships-email".into()],
            ..DashboardConfig::default()
        },
    )
    .await?;
    let html = dash.page("/keys?scope=shipping&key=msg_2aBc").await?;
    for expected in ["Inbox record", "processed", &email_id.to_string()] {
        assert!(html.contains(expected), "{expected}: {html}");
    }
    let api = dash.api("/api/keys?scope=shipping&key=msg_2aBc").await?;
    assert_eq!(api["inbox"]["outcome"], "processed", "{api}");
    assert_eq!(ids_in(&api["messages"]).len(), 1, "{api}");
    Ok(())
}

#[tokio::test]
async fn failure_groups_keep_status_codes_and_host_names_and_fold_ids_and_times() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let texts = [
        "503 Service Unavailable from api.stripe.com for ch_3MmlLrLkdIwHu7ix0snN0B15 at 2026-12-06T12:30:01Z",
        "503 Service Unavailable from api.stripe.com for ch_9ZZlLrLkdIwHu7ix0snN0B99 at 2026-12-07T08:00:59.5Z",
        "502 Bad Gateway from api.stripe.com for ch_3MmlLrLkdIwHu7ix0snN0B15 at 2026-12-06T12:30:01Z",
        "503 Service Unavailable from eu.stripe.com for ch_3MmlLrLkdIwHu7ix0snN0B15 at 2026-12-06T12:30:01Z",
        "connect to 10.0.0.5:5432 failed for order 12345",
        "connect to 10.0.0.6:5432 failed for order 67890",
    ];
    for (i, text) in texts.iter().enumerate() {
        let id = pending_empty(&mut client, "stripe", &format!("s-{i}")).await?;
        fail(&client, id, text).await?;
    }
    let groups = txoutbox::admin::failure_groups(&client, 100).await?;
    let mut classes: Vec<(String, u64)> =
        groups.iter().map(|g| (g.error.clone(), g.count)).collect();
    classes.sort();
    assert_eq!(
        classes,
        [
            (
                "502 Bad Gateway from api.stripe.com for <id> at <time>".to_owned(),
                1
            ),
            (
                "503 Service Unavailable from api.stripe.com for <id> at <time>".to_owned(),
                2
            ),
            (
                "503 Service Unavailable from eu.stripe.com for <id> at <time>".to_owned(),
                1
            ),
            (
                "connect to 10.0.0.5:5432 failed for order <n>".to_owned(),
                1
            ),
            (
                "connect to 10.0.0.6:5432 failed for order <n>".to_owned(),
                1
            ),
        ]
    );
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;
    let html = dash.page("/failures").await?;
    assert!(
        html.contains(r#"<td class="error">503 Service Unavailable from api.stripe.com for &lt;id&gt; at &lt;time&gt;"#),
        "{html}"
    );
    Ok(())
}

#[tokio::test]
async fn an_unknown_row_is_on_the_failures_page_in_its_own_group_with_its_actions() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let lost = "the relay stopped during an at-most-once attempt";
    let unknown = pending_empty(&mut client, "sms", "u-1").await?;
    settle(&client, unknown, "unknown", lost).await?;
    let failed = pending_empty(&mut client, "sms", "f-1").await?;
    fail(&client, failed, lost).await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;

    let html = dash.page("/failures").await?;
    let (unknown_part, failed_part) = html
        .split_once(r#"id="groups""#)
        .ok_or_else(|| anyhow::anyhow!("no failed section: {html}"))?;
    assert!(
        unknown_part.contains(r#"<table class="groups unknown">"#),
        "{html}"
    );
    assert!(unknown_part.contains(r#"<span class="count alarm">1 row(s)</span>"#));
    // Its own group, selecting the unknown row alone, with a replay and a discard.
    assert!(unknown_part.contains(&format!(r#"<td class="error">{lost}"#)));
    assert!(unknown_part.contains(r#"<input type="hidden" name="status" value="unknown">"#));
    assert!(
        unknown_part.contains("Replay this group") && unknown_part.contains("Discard this group")
    );
    assert!(failed_part.contains(r#"<input type="hidden" name="status" value="failed">"#));
    let list = dash
        .page(&format!(
            "/messages?status=unknown&destination=sms&error_class={}",
            lost.replace(' ', "+")
        ))
        .await?;
    assert!(links_row(&list, unknown), "{list}");
    assert!(!links_row(&list, failed), "{list}");

    // The group's discard (after its dry run) closes the unknown row, not the failed one.
    let answer = dash
        .post_json(
            "/api/discard",
            &json!({"filter": {"status": "unknown", "destination": "sms", "error_class": lost}, "reason": "sent by hand"}),
            None,
        )
        .await?;
    assert!(answer.status().is_success(), "{:?}", answer.text().await);
    assert_eq!(status_of(&client, unknown).await?, "discarded");
    assert_eq!(status_of(&client, failed).await?, "failed");
    Ok(())
}

#[tokio::test]
async fn only_a_pending_row_shows_a_next_attempt() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let [pending, failed, unknown] = pending_rows(
        &mut client,
        [("sms", "p-1"), ("sms", "f-1"), ("sms", "u-1")],
    )
    .await?;
    fail(&client, failed, "400 bad number").await?;
    settle(&client, unknown, "unknown", "timed out after sending").await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;
    for (id, shown) in [(pending, true), (failed, false), (unknown, false)] {
        let html = dash.page(&format!("/messages/{id}")).await?;
        assert_eq!(html.contains("Next attempt"), shown, "{id}: {html}");
        let api: Value = serde_json::from_str(&dash.page(&format!("/api/messages/{id}")).await?)?;
        assert_eq!(api["next_attempt_at"].is_null(), !shown, "{api}");
    }
    Ok(())
}

#[tokio::test]
async fn a_row_behind_its_keys_head_shows_it_waits_for_the_row_ahead() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let message = |key: &str| {
        OutboxMessage::new("sms", &json!({}))
            .map(|m| m.with_downstream_key(key).with_ordering_key("order-9"))
    };
    enqueue_committed(&mut client, &[message("w-1")?, message("w-2")?]).await?;
    let id_of = "SELECT id FROM txoutbox_messages WHERE downstream_key = $1";
    let head: Uuid = value_with(&client, id_of, &[&"w-1"]).await?;
    let behind: Uuid = value_with(&client, id_of, &[&"w-2"]).await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;
    for (id, waits) in [(head, false), (behind, true)] {
        let html = dash.page(&format!("/messages/{id}")).await?;
        assert!(html.contains("Next attempt"), "{id}: {html}");
        assert_eq!(
            html.contains("waits for the row ahead"),
            waits,
            "{id}: {html}"
        );
        let api: Value = serde_json::from_str(&dash.page(&format!("/api/messages/{id}")).await?)?;
        assert_eq!(api["waits_for_row_ahead"], waits, "{api}");
        assert_eq!(api["next_attempt_at"].is_null(), waits, "{api}");
    }
    Ok(())
}

#[tokio::test]
async fn keys_page_shows_the_stored_response_and_the_messages_its_request_enqueued() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let scope = Scope::new("charges")?;
    let key = IdempotencyKey::parse("req-42-0000000000")?;
    let tx = client.transaction().await?;
    let mut claim = new_claim(
        &tx,
        &scope,
        &key,
        &Fingerprint::new("POST", "/charge", b"{}"),
    )
    .await?;
    let receipt = OutboxMessage::new("email", &json!({"email": "alice@example.com"}))?;
    let charge = OutboxMessage::new("stripe", &json!({"amount": 5}))?;
    let (receipt_id, charge_id) = (receipt.id(), charge.id());
    claim
        .enqueue("receipt", receipt)?
        .enqueue("charge", charge)?;
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"charge":"ch_1","email":"alice@example.com"}"#.to_vec(),
    };
    claim.complete(&tx, &response).await?;
    tx.commit().await?;
    let other = pending_empty(&mut client, "email", "unrelated").await?;
    let dash = Dashboard::start(
        &db,
        DashboardConfig {
            redact: vec!["email".into()],
            effects: vec!["receipt".into(), "charge".into()],
            ..DashboardConfig::default()
        },
    )
    .await?;

    let html = dash
        .page("/keys?scope=charges&key=req-42-0000000000")
        .await?;
    for expected in [
        "completed",
        "201",
        "ch_1",
        &receipt_id.to_string(),
        &charge_id.to_string(),
    ] {
        assert!(html.contains(expected), "{expected}: {html}");
    }
    assert!(
        !html.contains(&other.to_string()),
        "another request's message"
    );
    assert!(
        !html.contains("alice@example.com"),
        "redacted in the stored response"
    );
    let api = dash
        .api("/api/keys?scope=charges&key=req-42-0000000000")
        .await?;
    assert_eq!(api["state"], "completed");
    assert_eq!(ids_in(&api["messages"]).len(), 2, "{api}");
    assert!(!api.to_string().contains("alice@example.com"));
    let html = dash.page("/keys?scope=charges&key=never-sent").await?;
    assert!(html.contains("No key"));

    // Without effect names the claim's transaction time alone finds them.
    let bare = Dashboard::start(&db, DashboardConfig::default()).await?;
    let api = bare
        .api("/api/keys?scope=charges&key=req-42-0000000000")
        .await?;
    let mut found = ids_in(&api["messages"]);
    found.sort();
    let mut want = vec![receipt_id.to_string(), charge_id.to_string()];
    want.sort();
    assert_eq!(found, want, "{api}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// the API

#[tokio::test]
async fn api_messages_answers_the_documented_json_shape() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = pending_empty(&mut client, "stripe", "s-1").await?;
    pending_empty(&mut client, "email", "e-1").await?;
    fail(&client, id, "402 card declined").await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;

    let rows = dash
        .api("/api/messages?status=failed&destination=stripe&limit=10")
        .await?;
    let rows = rows.as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["id"], id.to_string());
    assert_eq!(row["destination"], "stripe");
    assert_eq!(row["status"], "failed");
    assert_eq!(row["attempts"], 1);
    assert_eq!(row["last_error"], "402 card declined");
    assert_eq!(row["downstream_key"], "s-1");

    let stats = dash.api("/api/stats").await?;
    assert_eq!(stats["total"]["failed"], 1);
    assert_eq!(stats["total"]["pending"], 1);
    assert_eq!(
        stats["last_hour_by_minute"].as_array().map(Vec::len),
        Some(60)
    );
    let detail = dash.api(&format!("/api/messages/{id}")).await?;
    assert_eq!(detail["history"][0]["outcome"], "failed");

    let res = dash
        .send(Method::GET, "/api/messages?status=dead", None)
        .await?;
    bad_request(res, "dead").await?;
    Ok(())
}

#[tokio::test]
async fn replay_through_the_api_with_a_relay_running_is_delivered_and_logged_with_the_user(
) -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = message(&mut client)
        .destination("stripe")
        .key("s-1")
        .payload(json!({"amount": 5}))
        .create()
        .await?;
    // A real relay dead-letters it.
    let declining = ScriptedSink::new([Err(DeliveryError::permanent("402 card declined"))]);
    let relay = RunningRelay::start(db.relay()?.sink("stripe", declining).build()?);
    wait_for_row(&client, id, MessageStatus::Failed).await?;
    relay.stop().await?;
    let sink = RecordingSink::new();
    let relay = RunningRelay::start(db.relay()?.sink("stripe", sink.clone()).build()?);
    let dash = Dashboard::start(&db, users()?).await?;

    let res = dash
        .send(Method::POST, &format!("/api/messages/{id}/replay"), ALICE)
        .await?;
    assert_eq!(res.status(), StatusCode::OK);
    let report: Value = res.json().await?;
    assert_eq!(report["replayed"][0]["downstream_key"], "s-1");
    assert_eq!(sink.wait_for(1, Duration::from_secs(10)).await, 1);
    wait_for_row(&client, id, MessageStatus::Delivered).await?;
    relay.stop().await?;
    assert_eq!(sink.deliveries()[0].downstream_key, "s-1", "the same key");
    let detail = dash
        .send(Method::GET, &format!("/api/messages/{id}"), ALICE)
        .await?;
    let detail: Value = detail.json().await?;
    assert_eq!(detail["status"], "delivered");
    let notes: Vec<&str> = detail["history"]
        .as_array()
        .map(|h| h.iter().filter_map(|a| a["error"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        notes.iter().any(|n| n.contains("by operator alice")),
        "{notes:?}"
    );
    Ok(())
}

#[tokio::test]
async fn replay_of_everything_a_filter_matches_shows_a_dry_run_count_then_replays_on_confirmation(
) -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let mut stripe = Vec::new();
    for i in 0..3 {
        let id = message(&mut client)
            .destination("stripe")
            .key(&format!("s-{i}"))
            .payload(json!({}))
            .create()
            .await?;
        fail(&client, id, "402 card declined").await?;
        stripe.push(id);
    }
    let email = pending_empty(&mut client, "email", "e-1").await?;
    fail(&client, email, "550 no such user").await?;
    let dash = Dashboard::start(&db, users()?).await?;

    let filter = [("status", "failed"), ("destination", "stripe")];
    let (status, html) = dash.post_form("/replay/filter", &filter, ALICE).await?;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(
        html.contains("<strong>3</strong> message(s) match"),
        "{html}"
    );
    assert!(html.contains(r#"name="confirm" value="3""#));
    assert_all(&client, &stripe, "failed", "a dry run changes nothing").await?;

    let mut confirmed = filter.to_vec();
    confirmed.push(("confirm", "3"));
    let (status, html) = dash.post_form("/replay/filter", &confirmed, ALICE).await?;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("Replayed <strong>3</strong>"), "{html}");
    assert_all(&client, &stripe, "pending", "replayed").await?;
    assert_eq!(
        status_of(&client, email).await?,
        "failed",
        "outside the filter"
    );

    // The API's dry run counts the same way.
    let res = dash
        .post_json(
            "/api/replay",
            &json!({"filter": {"status": "failed"}, "dry_run": true}),
            ALICE,
        )
        .await?;
    let report: Value = res.json().await?;
    assert_eq!(report["dry_run"], true);
    assert_eq!(ids_in(&report["replayed"]), vec![email.to_string()]);
    assert_eq!(status_of(&client, email).await?, "failed");
    Ok(())
}

#[tokio::test]
async fn a_selection_is_replayed_from_the_list_form() -> TestResult {
    let (_db, client, dash, [a, b, c]) = failed_rows_on_a_dashboard().await?;
    let (status, html) = dash
        .post_selection("/replay", &[a, b], &[("new_key", "1")], ALICE)
        .await?;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert_eq!(status_of(&client, a).await?, "pending");
    assert_eq!(status_of(&client, b).await?, "pending");
    assert_eq!(status_of(&client, c).await?, "failed");
    assert_eq!(
        downstream_key_of(&client, a).await?,
        txoutbox::admin::replay_downstream_key(a, "s-0"),
        "a new key was asked for"
    );
    Ok(())
}

#[tokio::test]
async fn hostile_query_values_are_answered_400_not_500() -> TestResult {
    let db = test_db().await?;
    let dash = Dashboard::start(&db, DashboardConfig::default()).await?;
    for path in [
        "/messages?destination=a%00b",
        "/messages?error=%00",
        "/messages?before=99999999999999999999.1",
        "/messages?before=1.x",
        "/messages?limit=-5",
        "/messages?status=dead",
        "/messages?until=10000000000y",
        "/keys?scope=charges&key=k%00",
        "/api/messages?key=%00",
        "/api/keys?scope=%00&key=k",
    ] {
        dash.assert_get(path, None, 400).await?;
    }
    let res = dash
        .request(Method::POST, "/api/replay", None)
        .body("{not json")
        .send()
        .await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let res = dash
        .post_json(
            "/api/replay",
            &json!({"filter": {"destination": "a\u{0}"}}),
            None,
        )
        .await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// discard

/// Each page that offers row `id`'s actions to an operator, read by the viewer and by alice (both
/// must answer 200): (path, the viewer's page, alice's page).
async fn row_pages_as_viewer_and_operator(
    dash: &Dashboard,
    id: Uuid,
) -> anyhow::Result<Vec<(String, String, String)>> {
    let mut pages = Vec::new();
    for path in [
        "/messages".to_owned(),
        format!("/messages/{id}"),
        "/failures".to_owned(),
    ] {
        let (status, viewers) = dash.get_as(&path, VICTOR).await?;
        assert_eq!(status, StatusCode::OK, "{path} as the viewer");
        let (status, operators) = dash.get_as(&path, ALICE).await?;
        assert_eq!(status, StatusCode::OK, "{path} as alice");
        pages.push((path, viewers, operators));
    }
    Ok(pages)
}

/// The last attempt-log entry of `id` as the API shows it, read as alice.
async fn last_attempt(dash: &Dashboard, id: Uuid) -> anyhow::Result<Value> {
    let res = dash
        .send(Method::GET, &format!("/api/messages/{id}"), ALICE)
        .await?;
    let detail: Value = res.json().await?;
    Ok(detail["history"]
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .unwrap_or_default())
}

/// `n` failed stripe rows; their ids.
async fn failed_rows(client: &mut Client, n: usize, prefix: &str) -> anyhow::Result<Vec<Uuid>> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = message(&mut *client)
            .destination("stripe")
            .key(&format!("{prefix}-{i}"))
            .payload(json!({}))
            .create()
            .await?;
        fail(client, id, "402 card declined").await?;
        ids.push(id);
    }
    Ok(ids)
}

/// A dashboard with the [`users`] over one pending row of each `(destination, downstream key)`
/// of `rows`: the database, a client of it and the dashboard.
async fn dashboard_over(rows: &[(&str, &str)]) -> anyhow::Result<(TestDb, Client, Dashboard)> {
    let (db, mut client) = test_db_with_client().await?;
    for (destination, key) in rows {
        pending_empty(&mut client, destination, key).await?;
    }
    let dash = Dashboard::start(&db, users()?).await?;
    Ok((db, client, dash))
}

/// `N` failed `stripe` rows (keys `s-{i}`, see [`failed_rows`]) under a dashboard with the
/// [`users`]: the database, a client of it, the dashboard and the rows' ids.
async fn failed_rows_on_a_dashboard<const N: usize>(
) -> anyhow::Result<(TestDb, Client, Dashboard, [Uuid; N])> {
    let (db, mut client) = test_db_with_client().await?;
    let rows = failed_rows(&mut client, N, "s").await?;
    let dash = Dashboard::start(&db, users()?).await?;
    let rows = rows
        .try_into()
        .map_err(|rows: Vec<Uuid>| anyhow::anyhow!("{} rows, not {N}", rows.len()))?;
    Ok((db, client, dash, rows))
}

#[tokio::test]
async fn a_row_discarded_from_its_page_is_closed_and_its_history_has_the_reason_and_the_user(
) -> TestResult {
    let (_db, client, dash, [id]) = failed_rows_on_a_dashboard().await?;

    let (_, html) = dash.get_as(&format!("/messages/{id}"), ALICE).await?;
    assert!(
        html.contains(&format!(r#"action="/outbox/messages/{id}/discard""#)),
        "{html}"
    );
    assert!(html.contains(r#"name="reason" required"#), "{html}");

    let (status, body) = dash
        .post_reason(
            &format!("/messages/{id}/discard"),
            "refunded by hand",
            ALICE,
        )
        .await?;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(status_of(&client, id).await?, "discarded");
    let last = last_attempt(&dash, id).await?;
    assert_eq!(last["outcome"], "discarded");
    assert_eq!(last["relay"], "operator");
    assert_eq!(last["error"], "refunded by hand (by operator alice)");

    // A discarded row offers no action any more.
    let (_, html) = dash.get_as(&format!("/messages/{id}"), ALICE).await?;
    assert!(
        html.contains("refunded by hand (by operator alice)"),
        "{html}"
    );
    assert!(!html.contains("method=\"post\""), "{html}");
    Ok(())
}

#[tokio::test]
async fn a_selection_is_discarded_from_the_list_form() -> TestResult {
    let (_db, client, dash, rows) = failed_rows_on_a_dashboard::<3>().await?;

    let (_, html) = dash.get_as("/messages", ALICE).await?;
    assert!(
        html.contains(r#"formaction="/outbox/discard">Discard selected</button>"#),
        "{html}"
    );
    let (status, html) = dash
        .post_selection("/discard", &rows[..2], &[("reason", "test data")], ALICE)
        .await?;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("Discarded <strong>2</strong>"), "{html}");
    assert_eq!(status_of(&client, rows[0]).await?, "discarded");
    assert_eq!(status_of(&client, rows[1]).await?, "discarded");
    assert_eq!(status_of(&client, rows[2]).await?, "failed", "not selected");
    assert_eq!(
        last_attempt(&dash, rows[1]).await?["error"],
        "test data (by operator alice)"
    );
    Ok(())
}

#[tokio::test]
async fn discard_of_everything_a_filter_matches_shows_a_dry_run_count_then_discards_on_confirmation(
) -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let stripe = failed_rows(&mut client, 3, "s").await?;
    let waiting = pending_empty(&mut client, "stripe", "s-pending").await?;
    let email = pending_empty(&mut client, "email", "e-1").await?;
    fail(&client, email, "550 no such user").await?;
    let dash = Dashboard::start(&db, users()?).await?;

    let (_, list) = dash.get_as("/messages?destination=stripe", ALICE).await?;
    assert!(
        list.contains(r#"formaction="/outbox/discard/filter">Discard all matching this filter"#),
        "{list}"
    );
    let (_, failures) = dash.get_as("/failures", ALICE).await?;
    assert!(failures.contains("Discard this group"), "{failures}");

    let filter = [("destination", "stripe")];
    let (status, html) = dash.post_form("/discard/filter", &filter, ALICE).await?;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(
        html.contains("<strong>3</strong> message(s) match and would be discarded"),
        "{html}"
    );
    assert!(html.contains(r#"name="confirm" value="3""#), "{html}");
    assert!(html.contains(r#"name="reason" required"#), "{html}");
    assert_all(&client, &stripe, "failed", "a dry run changes nothing").await?;

    // More rows match than were confirmed: refused, nothing changes.
    let mut too_few = filter.to_vec();
    too_few.extend([("confirm", "2"), ("reason", "card test data")]);
    let (status, html) = dash.post_form("/discard/filter", &too_few, ALICE).await?;
    assert_eq!(status, StatusCode::CONFLICT, "{html}");
    assert_eq!(status_of(&client, stripe[0]).await?, "failed");

    let mut confirmed = filter.to_vec();
    confirmed.extend([("confirm", "3"), ("reason", "card test data")]);
    let (status, html) = dash.post_form("/discard/filter", &confirmed, ALICE).await?;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("Discarded <strong>3</strong>"), "{html}");
    assert_all(&client, &stripe, "discarded", "discarded").await?;
    assert_eq!(
        last_attempt(&dash, stripe[2]).await?["error"],
        "card test data (by operator alice)"
    );
    assert_eq!(status_of(&client, waiting).await?, "pending", "not failed");
    assert_eq!(
        status_of(&client, email).await?,
        "failed",
        "outside the filter"
    );
    Ok(())
}

#[tokio::test]
async fn a_pending_row_is_not_discarded_and_says_why_changing_nothing() -> TestResult {
    let (_db, mut client, dash, [failed]) = failed_rows_on_a_dashboard().await?;
    let waiting = pending_empty(&mut client, "stripe", "s-pending").await?;

    let (_, html) = dash.get_as(&format!("/messages/{waiting}"), ALICE).await?;
    assert!(!html.contains("/discard\""), "no discard offered: {html}");

    let (status, html) = dash
        .post_reason(&format!("/messages/{waiting}/discard"), "not wanted", ALICE)
        .await?;
    assert_eq!(status, StatusCode::CONFLICT, "{html}");
    assert!(
        html.contains("is pending: only failed and unknown rows are discarded"),
        "{html}"
    );
    // One refused row refuses the whole selection.
    let (status, html) = dash
        .post_selection(
            "/discard",
            &[failed, waiting],
            &[("reason", "not wanted")],
            ALICE,
        )
        .await?;
    assert_eq!(status, StatusCode::CONFLICT, "{html}");
    assert_eq!(status_of(&client, waiting).await?, "pending");
    assert_eq!(status_of(&client, failed).await?, "failed");
    Ok(())
}

#[tokio::test]
async fn a_discard_without_a_reason_is_a_400_and_changes_nothing() -> TestResult {
    let (_db, client, dash, [id]) = failed_rows_on_a_dashboard().await?;
    let id_s = id.to_string();

    for (path, form) in [
        (format!("/messages/{id}/discard"), vec![("reason", "   ")]),
        (format!("/messages/{id}/discard"), vec![]),
        ("/discard".to_owned(), vec![("ids", id_s.as_str())]),
        (
            "/discard/filter".to_owned(),
            vec![("confirm", "1"), ("reason", "")],
        ),
    ] {
        let (status, html) = dash.post_form(&path, &form, ALICE).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {html}");
        assert!(html.contains("a discard needs a reason"), "{path}: {html}");
    }
    let res = dash
        .post_json(
            &format!("/api/messages/{id}/discard"),
            &json!({"reason": ""}),
            ALICE,
        )
        .await?;
    bad_request(res, "a discard needs a reason").await?;
    assert_eq!(status_of(&client, id).await?, "failed");
    Ok(())
}

/// An action on the message a path names refuses `ids` or a `filter` in its body: they name
/// other rows than the one it would touch. Nothing changes.
#[tokio::test]
async fn an_action_on_one_message_refuses_a_selection_in_its_body() -> TestResult {
    let (_db, client, dash, rows) = failed_rows_on_a_dashboard::<2>().await?;
    let (id, other) = (rows[0], rows[1].to_string());
    for (action, body) in [
        ("replay", json!({"ids": [other]})),
        ("replay", json!({"filter": {"destination": "stripe"}})),
        ("discard", json!({"reason": "by hand", "ids": [other]})),
        ("discard", json!({"reason": "by hand", "filter": {}})),
    ] {
        let path = format!("/api/messages/{id}/{action}");
        let res = dash.post_json(&path, &body, ALICE).await?;
        bad_request(res, "the path names the message").await?;
    }
    assert_all(&client, &rows, "failed", "nothing changes").await?;
    Ok(())
}

#[tokio::test]
async fn discard_through_the_api_one_row_and_by_filter_with_a_dry_run() -> TestResult {
    let (_db, client, dash, rows) = failed_rows_on_a_dashboard::<3>().await?;

    let res = dash
        .request(
            Method::POST,
            &format!("/api/messages/{}/discard", rows[0]),
            ALICE,
        )
        .json(&json!({"reason": "refunded by hand"}))
        .send()
        .await?;
    assert_eq!(res.status(), StatusCode::OK);
    let report: Value = res.json().await?;
    assert_eq!(ids_in(&report["discarded"]), vec![rows[0].to_string()]);
    assert_eq!(report["discarded"][0]["from"], "failed");
    assert_eq!(status_of(&client, rows[0]).await?, "discarded");
    assert_eq!(
        last_attempt(&dash, rows[0]).await?["error"],
        "refunded by hand (by operator alice)"
    );

    let dry = json!({"filter": {"destination": "stripe"}, "dry_run": true, "reason": "test"});
    let res = dash.post_json("/api/discard", &dry, ALICE).await?;
    assert_eq!(res.status(), StatusCode::OK);
    let report: Value = res.json().await?;
    assert_eq!(report["dry_run"], true);
    assert_eq!(
        ids_in(&report["discarded"]),
        vec![rows[1].to_string(), rows[2].to_string()]
    );
    assert_eq!(status_of(&client, rows[1]).await?, "failed", "a dry run");

    let res = dash
        .post_json(
            "/api/discard",
            &json!({"ids": [rows[1]], "reason": "test"}),
            ALICE,
        )
        .await?;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(status_of(&client, rows[1]).await?, "discarded");
    assert_eq!(status_of(&client, rows[2]).await?, "failed");

    let res = dash
        .post_json(
            "/api/discard",
            &json!({"ids": [rows[2]], "filter": {}, "reason": "test"}),
            ALICE,
        )
        .await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST, "ids or a filter");
    Ok(())
}

#[tokio::test]
async fn a_viewer_sees_no_discard_and_a_forged_discard_is_403() -> TestResult {
    let (_db, client, dash, [id]) = failed_rows_on_a_dashboard().await?;

    for (path, viewers, operators) in row_pages_as_viewer_and_operator(&dash, id).await? {
        assert!(!viewers.contains("Discard"), "{path}: {viewers}");
        assert!(
            operators.contains("Discard"),
            "{path}: an operator may discard"
        );
    }
    let id_s = id.to_string();
    let reason = ("reason", "viewer's wish");
    for (path, form) in [
        (format!("/messages/{id}/discard"), vec![reason]),
        ("/discard".to_owned(), vec![("ids", id_s.as_str()), reason]),
        ("/discard/filter".to_owned(), vec![("confirm", "1"), reason]),
    ] {
        let (status, _) = dash.post_form(&path, &form, VICTOR).await?;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
    }
    for (path, body) in [
        (
            format!("/api/messages/{id}/discard"),
            json!({"reason": "viewer's wish"}),
        ),
        (
            "/api/discard".to_owned(),
            json!({"ids": [id], "reason": "viewer's wish"}),
        ),
    ] {
        let res = dash.post_json(&path, &body, VICTOR).await?;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{path}");
    }
    assert_eq!(status_of(&client, id).await?, "failed");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// flow control

/// Pauses `destination` for `reason` as bob, through the admin API rather than the dashboard.
async fn paused_by_bob(client: &mut Client, destination: &str, reason: &str) -> TestResult {
    txoutbox::admin::pause_destination(client, destination, reason, Some("bob")).await?;
    Ok(())
}

/// A destination's pause as `txoutbox_destinations` holds it: (paused, by, reason); `None`
/// without a row.
async fn pause_of(
    client: &Client,
    destination: &str,
) -> anyhow::Result<Option<(bool, Option<String>, Option<String>)>> {
    let row = client
        .query_opt(
            "SELECT paused_at IS NOT NULL, paused_by, paused_reason FROM txoutbox_destinations \
             WHERE destination = $1",
            &[&destination],
        )
        .await?;
    Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
}

/// The destination-wide entries of the attempt log for `destination`, oldest first: (outcome,
/// relay, note), each checked to have no message.
async fn destination_log(
    client: &Client,
    destination: &str,
) -> anyhow::Result<Vec<(String, String, String)>> {
    let rows = client
        .query(
            "SELECT outcome, relay, COALESCE(error, ''), message_id IS NULL \
             FROM txoutbox_attempts WHERE destination = $1 ORDER BY finished_at",
            &[&destination],
        )
        .await?;
    let mut log = Vec::new();
    for row in rows {
        anyhow::ensure!(row.get::<_, bool>(3), "a destination entry has no message");
        log.push((row.get(0), row.get(1), row.get(2)));
    }
    Ok(log)
}

/// The overview's table row of `destination` (from its row header to the row's end).
fn overview_row<'a>(html: &'a str, destination: &str) -> &'a str {
    let start = html
        .find(&format!(">{destination}</a></th>"))
        .unwrap_or(html.len());
    let rest = &html[start..];
    &rest[..rest.find("</tr>").unwrap_or(rest.len())]
}

#[tokio::test]
async fn a_destination_paused_from_the_overview_is_paused_and_logged_with_the_user_and_reason(
) -> TestResult {
    let (_db, client, dash) = dashboard_over(&[("stripe", "s-1")]).await?;

    let (_, html) = dash.get_as("", ALICE).await?;
    let row = overview_row(&html, "stripe");
    assert!(
        row.contains(r#"action="/outbox/destinations/stripe/pause""#),
        "{row}"
    );
    assert!(row.contains(r#"name="reason" required"#), "{row}");
    assert!(!row.contains("/resume"), "not paused: {row}");

    let (status, body) = dash
        .form_pause("stripe", "Stripe incident 42", ALICE)
        .await?;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(
        pause_of(&client, "stripe").await?,
        Some((
            true,
            Some("alice".into()),
            Some("Stripe incident 42".into())
        ))
    );
    assert_eq!(
        destination_log(&client, "stripe").await?,
        vec![(
            "paused".into(),
            "operator".into(),
            "Stripe incident 42 (by alice)".into()
        )]
    );

    let (_, html) = dash.get_as("", ALICE).await?;
    let row = overview_row(&html, "stripe");
    assert!(
        row.contains(
            r#"<span class="flow paused">paused</span> by alice since <span class="when"><time"#
        ),
        "{row}"
    );
    assert!(row.contains(": Stripe incident 42"), "{row}");
    assert!(
        row.contains(r#"action="/outbox/destinations/stripe/resume""#),
        "{row}"
    );
    assert!(!row.contains("/pause\""), "paused: no second pause: {row}");
    Ok(())
}

#[tokio::test]
async fn a_paused_destination_resumed_from_the_overview_is_open_again_and_logged_with_the_user(
) -> TestResult {
    let (_db, mut client, dash) = dashboard_over(&[("stripe", "s-1")]).await?;
    paused_by_bob(&mut client, "stripe", "Stripe incident").await?;

    let (status, body) = dash
        .post_form("/destinations/stripe/resume", &[], ALICE)
        .await?;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(
        pause_of(&client, "stripe").await?,
        Some((false, None, None))
    );
    let log = destination_log(&client, "stripe").await?;
    assert_eq!(
        log.last(),
        Some(&("resumed".into(), "operator".into(), "by alice".into())),
        "{log:?}"
    );

    let (_, html) = dash.get_as("", ALICE).await?;
    let row = overview_row(&html, "stripe");
    assert!(!row.contains(r#"class="flow paused""#), "{row}");
    assert!(
        row.contains(r#"action="/outbox/destinations/stripe/pause""#),
        "{row}"
    );
    Ok(())
}

#[tokio::test]
async fn resuming_a_destination_that_is_not_paused_says_so_and_changes_nothing() -> TestResult {
    let (_db, client, dash) = dashboard_over(&[("stripe", "s-1")]).await?;

    let (status, html) = dash
        .post_form("/destinations/stripe/resume", &[], ALICE)
        .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{html}");
    assert!(
        html.contains("destination &quot;stripe&quot; is not paused"),
        "{html}"
    );
    let res = dash
        .send(Method::POST, "/api/destinations/stripe/resume", ALICE)
        .await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let problem: Value = res.json().await?;
    assert!(
        problem["error"]
            .as_str()
            .is_some_and(|e| e.ends_with(r#"destination "stripe" is not paused"#)),
        "{problem}"
    );
    assert!(destination_log(&client, "stripe").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn an_api_pause_of_a_destination_nothing_names_is_a_400_with_the_known_ones() -> TestResult {
    let (_db, client, dash) = dashboard_over(&[("stripe", "s-1"), ("email", "e-1")]).await?;

    let res = dash.api_pause("strpie", "Stripe incident", ALICE).await?;
    let problem = bad_request(res, r#"destination "strpie""#).await?;
    assert_eq!(
        problem["known_destinations"],
        json!(["stripe", "email"]),
        "{problem}"
    );
    assert_eq!(pause_of(&client, "strpie").await?, None);
    assert!(destination_log(&client, "strpie").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_configured_destination_or_a_forced_one_is_paused_before_its_first_row() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let config = DashboardConfig {
        destinations: vec!["sms".into()],
        ..users()?
    };
    let dash = Dashboard::start(&db, config).await?;

    let configured = dash.api_pause("sms", "not live yet", ALICE).await?;
    assert_eq!(configured.status(), StatusCode::OK);
    let forced = dash
        .post_json(
            "/api/destinations/push/pause",
            &json!({"reason": "not live yet", "force": true}),
            ALICE,
        )
        .await?;
    assert_eq!(forced.status(), StatusCode::OK);
    for destination in ["sms", "push"] {
        assert_eq!(
            pause_of(&client, destination).await?,
            Some((true, Some("alice".into()), Some("not live yet".into())))
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_pause_without_a_reason_is_a_400_and_pauses_nothing() -> TestResult {
    let (_db, client, dash) = dashboard_over(&[("stripe", "s-1")]).await?;

    for form in [vec![("reason", "   ")], vec![]] {
        let (status, html) = dash
            .post_form("/destinations/stripe/pause", &form, ALICE)
            .await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form:?}: {html}");
        assert!(html.contains("a pause needs a reason"), "{html}");
    }
    for body in [json!({"reason": ""}), json!({})] {
        let res = dash
            .post_json("/api/destinations/stripe/pause", &body, ALICE)
            .await?;
        bad_request(res, "a pause needs a reason").await?;
    }
    assert_eq!(pause_of(&client, "stripe").await?, None);
    assert!(destination_log(&client, "stripe").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn the_overview_shows_each_destinations_flow_state_to_viewers_too() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    for destination in ["stripe", "webhook", "email", "sms"] {
        message(&mut client)
            .destination(destination)
            .key("k-1")
            .payload(json!({}))
            .create()
            .await?;
    }
    paused_by_bob(&mut client, "stripe", "Stripe incident").await?;
    // Where a relay's breaker and rate limit would put them.
    client
        .batch_execute(
            "INSERT INTO txoutbox_destinations (destination, breaker, failures, open_until, \
                 open_reason) \
             VALUES ('webhook', 'open', 10, now() + interval '1 hour', '429 Retry-After: 3600'), \
                 ('email', 'half_open', 10, now() - interval '1 second', '10 failures'); \
             INSERT INTO txoutbox_destinations (destination, rate_per_sec, burst, tokens) \
             VALUES ('sms', 20, 2, 2)",
        )
        .await?;
    // A destination paused before its first row is listed too.
    paused_by_bob(&mut client, "idle", "not yet live").await?;
    let dash = Dashboard::start(&db, users()?).await?;

    let (status, html) = dash.get_as("", VICTOR).await?;
    assert_eq!(status, StatusCode::OK);
    let stripe = overview_row(&html, "stripe");
    assert!(
        stripe.contains(r#"paused</span> by bob since <span class="when"><time"#)
            && stripe.contains(": Stripe incident"),
        "{stripe}"
    );
    // A time says how long ago, or how far ahead, with the absolute time beside it.
    let at = stripe
        .split(r#"since <span class="when"><time datetime=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default();
    assert_eq!(at.len(), "2026-01-01T00:00:00Z".len(), "{stripe}");
    assert!(
        stripe.contains(&format!(r#"title="{at}">"#))
            && stripe.contains(r#" s ago</time> <small class="abs">"#)
            && stripe.contains(&format!("{at}</small></span>")),
        "{stripe}"
    );
    let webhook = overview_row(&html, "webhook");
    assert!(
        webhook.contains(
            r#"<span class="flow open">open</span> (breaker) until <span class="when"><time"#
        ) && webhook.contains(">in 59 min ")
            && webhook.contains(": 429 Retry-After: 3600")
            && webhook.contains("10 consecutive failure(s) counted"),
        "{webhook}"
    );
    let email = overview_row(&html, "email");
    assert!(
        email.contains("half_open</span> (breaker): one probe at a time"),
        "{email}"
    );
    let sms = overview_row(&html, "sms");
    assert!(
        sms.contains("closed</span>") && sms.contains("rate limit 20/s, 2.0 tokens"),
        "{sms}"
    );
    let idle = overview_row(&html, "idle");
    assert!(idle.contains("paused</span> by bob"), "{idle}");
    Ok(())
}

#[tokio::test]
async fn a_viewer_sees_no_pause_or_resume_and_a_forged_one_is_403() -> TestResult {
    let (_db, mut client, dash) = dashboard_over(&[("stripe", "s-1"), ("email", "e-1")]).await?;
    paused_by_bob(&mut client, "stripe", "Stripe incident").await?;

    let (_, html) = dash.get_as("", VICTOR).await?;
    assert!(html.contains("Stripe incident"), "a viewer sees the pause");
    assert!(!html.contains("method=\"post\""), "no action form: {html}");
    assert!(
        !html.contains("Pause…") && !html.contains("Resume"),
        "{html}"
    );
    let (_, html) = dash.get_as("", ALICE).await?;
    assert!(html.contains("Pause…") && html.contains("Resume"), "{html}");

    let (status, _) = dash.form_pause("email", "viewer's wish", VICTOR).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = dash
        .post_form("/destinations/stripe/resume", &[], VICTOR)
        .await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for (path, body) in [
        (
            "/api/destinations/email/pause",
            json!({"reason": "viewer's wish"}),
        ),
        ("/api/destinations/stripe/resume", json!({})),
    ] {
        let res = dash.post_json(path, &body, VICTOR).await?;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{path}");
    }
    assert_eq!(pause_of(&client, "email").await?, None);
    assert_eq!(
        pause_of(&client, "stripe").await?.map(|p| p.0),
        Some(true),
        "still paused"
    );
    Ok(())
}

#[tokio::test]
async fn a_cross_site_pause_or_resume_is_refused_and_changes_nothing() -> TestResult {
    let (_db, mut client, dash) = dashboard_over(&[("stripe", "s-1"), ("email", "e-1")]).await?;
    paused_by_bob(&mut client, "email", "SMTP relay down").await?;
    let form = "reason=win+a+prize";

    let forged = dash
        .form_from(
            "/destinations/stripe/pause",
            form,
            "https://evil.example",
            ALICE,
        )
        .await?;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let forged = dash
        .cross_site("/destinations/email/resume", ALICE)
        .send()
        .await?;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let forged = dash
        .cross_site("/api/destinations/stripe/pause", ALICE)
        .json(&json!({"reason": "win a prize"}))
        .send()
        .await?;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert_eq!(pause_of(&client, "stripe").await?, None);
    assert_eq!(pause_of(&client, "email").await?.map(|p| p.0), Some(true));
    let res = dash
        .send(Method::GET, "/destinations/stripe/pause", ALICE)
        .await?;
    assert_eq!(
        res.status(),
        StatusCode::METHOD_NOT_ALLOWED,
        "actions are POST only"
    );

    // The dashboard's own page (same origin) may.
    let own = dash
        .form_from(
            "/destinations/stripe/pause",
            form,
            dash.base.trim_end_matches("/outbox"),
            ALICE,
        )
        .await?;
    assert_eq!(own.status(), StatusCode::SEE_OTHER);
    assert_eq!(pause_of(&client, "stripe").await?.map(|p| p.0), Some(true));
    Ok(())
}

#[tokio::test]
async fn pause_list_and_resume_through_the_api() -> TestResult {
    let (_db, client, dash) = dashboard_over(&[("stripe", "s-1")]).await?;

    let res = dash.api_pause("stripe", "Stripe incident", ALICE).await?;
    assert_eq!(res.status(), StatusCode::OK);
    let flow: Value = res.json().await?;
    assert_eq!(flow["destination"], "stripe");
    assert_eq!(flow["state"], "paused");
    assert_eq!(flow["paused_by"], "alice");
    assert_eq!(flow["paused_reason"], "Stripe incident");
    assert!(flow["paused_at"].is_string(), "{flow}");

    let res = dash.send(Method::GET, "/api/destinations", VICTOR).await?;
    assert_eq!(res.status(), StatusCode::OK, "a viewer reads the list");
    let list: Value = res.json().await?;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["destination"], "stripe");
    assert_eq!(list[0]["state"], "paused");
    assert_eq!(list[0]["failures"], 0);
    assert!(list[0]["rate_per_sec"].is_null(), "{list}");

    let res = dash
        .send(Method::POST, "/api/destinations/stripe/resume", ALICE)
        .await?;
    assert_eq!(res.status(), StatusCode::OK);
    let flow: Value = res.json().await?;
    assert_eq!(flow["state"], "closed");
    assert!(flow["paused_at"].is_null(), "{flow}");
    assert_eq!(pause_of(&client, "stripe").await?.map(|p| p.0), Some(false));
    let log = destination_log(&client, "stripe").await?;
    let outcomes: Vec<&str> = log.iter().map(|(o, _, _)| o.as_str()).collect();
    assert_eq!(outcomes, ["paused", "resumed"]);
    assert_eq!(log[1].2, "by alice");

    let res = dash
        .post_json(
            "/api/destinations/stripe/pause",
            &json!({"reason": "x", "until": "tomorrow"}),
            ALICE,
        )
        .await?;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST, "an unknown field");
    assert_eq!(pause_of(&client, "stripe").await?.map(|p| p.0), Some(false));
    Ok(())
}

#[tokio::test]
async fn a_destination_named_with_colons_slashes_or_spaces_is_paused_and_resumed_by_its_path(
) -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending_empty(&mut client, "webhook:orders", "w-1").await?;
    pending_empty(&mut client, "partner/eu west", "p-1").await?;
    let dash = Dashboard::start(&db, users()?).await?;

    let (_, html) = dash.get_as("", ALICE).await?;
    assert!(
        html.contains(r#"action="/outbox/destinations/webhook:orders/pause""#),
        "{html}"
    );
    assert!(
        html.contains(r#"action="/outbox/destinations/partner%2Feu%20west/pause""#),
        "{html}"
    );

    for (name, path) in [
        ("webhook:orders", "webhook:orders"),
        ("partner/eu west", "partner%2Feu%20west"),
    ] {
        let (status, body) = dash.form_pause(path, "downstream migration", ALICE).await?;
        assert_eq!(status, StatusCode::SEE_OTHER, "{name}: {body}");
        assert_eq!(
            pause_of(&client, name).await?.map(|p| p.0),
            Some(true),
            "{name}"
        );
        let (_, html) = dash.get_as("", ALICE).await?;
        assert!(
            html.contains(&format!(r#"action="/outbox/destinations/{path}/resume""#)),
            "{name}: {html}"
        );
        let res = dash
            .request(
                Method::POST,
                &format!("/api/destinations/{path}/resume"),
                ALICE,
            )
            .send()
            .await?;
        assert_eq!(res.status(), StatusCode::OK, "{name}");
        let flow: Value = res.json().await?;
        assert_eq!(flow["destination"], name);
        assert_eq!(pause_of(&client, name).await?.map(|p| p.0), Some(false));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// security

#[tokio::test]
async fn without_credentials_every_answer_is_401_with_a_basic_challenge() -> TestResult {
    let db = test_db().await?;
    let dash = Dashboard::start(&db, users()?).await?;
    for path in ["", "/messages", "/api/stats", "/assets/dashboard.css"] {
        let res = dash.send(Method::GET, path, None).await?;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{path}");
        let challenge = res
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok());
        assert!(challenge.is_some_and(|c| c.starts_with("Basic ")), "{path}");
    }
    dash.assert_get("", Some(("alice", "wrong")), 401).await?;
    dash.assert_get("", ALICE, 200).await?;
    Ok(())
}

#[tokio::test]
async fn a_viewer_reads_sees_no_action_and_a_forged_action_is_403() -> TestResult {
    let (_db, client, dash, [id]) = failed_rows_on_a_dashboard().await?;

    for (path, viewers, operators) in row_pages_as_viewer_and_operator(&dash, id).await? {
        assert!(
            !viewers.contains("<button type=\"submit\">Replay"),
            "{path}: {viewers}"
        );
        assert!(
            !viewers.contains("method=\"post\""),
            "{path}: no action form"
        );
        assert!(
            operators.contains("method=\"post\""),
            "{path}: an operator has actions"
        );
    }
    let id_s = id.to_string();
    let (status, _) = dash
        .post_form(&format!("/messages/{id}/replay"), &[], VICTOR)
        .await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = dash.post_form("/replay", &[("ids", &id_s)], VICTOR).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let res = dash
        .post_json("/api/replay", &json!({"ids": [id]}), VICTOR)
        .await?;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(status_of(&client, id).await?, "failed");
    Ok(())
}

#[tokio::test]
async fn a_cross_site_replay_or_discard_is_refused_and_changes_nothing() -> TestResult {
    // Each row action: its form, its API body, and the row's status once the dashboard's own
    // page posted the form.
    for (action, form, body, after) in [
        ("replay", "", json!({}), "pending"),
        (
            "discard",
            "reason=win+a+prize",
            json!({"reason": "win a prize"}),
            "discarded",
        ),
    ] {
        let (_db, client, dash, [id]) = failed_rows_on_a_dashboard().await?;
        let path = format!("/messages/{id}/{action}");
        let mut body = body;
        body["ids"] = json!([id]);

        let forged = dash
            .form_from(&path, form, "https://evil.example", ALICE)
            .await?;
        assert_eq!(forged.status(), StatusCode::FORBIDDEN, "{action}");
        let forged = dash
            .cross_site(&format!("/api/{action}"), ALICE)
            .json(&body)
            .send()
            .await?;
        assert_eq!(forged.status(), StatusCode::FORBIDDEN, "{action}");
        assert_eq!(status_of(&client, id).await?, "failed", "{action}");
        let res = dash.send(Method::GET, &path, ALICE).await?;
        assert_eq!(
            res.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{action}: actions are POST only"
        );

        // The dashboard's own page (same origin) may.
        let own = dash
            .form_from(&path, form, dash.base.trim_end_matches("/outbox"), ALICE)
            .await?;
        assert_eq!(own.status(), StatusCode::SEE_OTHER, "{action}");
        assert_eq!(status_of(&client, id).await?, after, "{action}");
    }
    Ok(())
}

#[tokio::test]
async fn redacted_fields_never_reach_the_browser() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let payload = json!({
        "email": "alice@example.com",
        "order": {"items": [{"card": {"number": "4242424242424242"}, "sku": "tea"}]},
        "customer": {"Email": "bob@example.com"},
    });
    let message = OutboxMessage::new("email", &payload)?
        .with_downstream_key("e-1")
        .with_header("card", "4000056655665556");
    let id = message.id();
    enqueue_committed(&mut client, &[message]).await?;
    let dash = Dashboard::start(
        &db,
        DashboardConfig {
            redact: vec!["email".into(), "card".into()],
            ..DashboardConfig::default()
        },
    )
    .await?;

    let html = dash.page(&format!("/messages/{id}")).await?;
    let api = dash.page(&format!("/api/messages/{id}")).await?;
    for body in [&html, &api] {
        for secret in [
            "alice@example.com",
            "4242424242424242",
            "bob@example.com",
            "4000056655665556",
        ] {
            assert!(!body.contains(secret), "{secret} leaked: {body}");
        }
        assert!(body.contains("[redacted]"));
        assert!(body.contains("tea"), "other fields stay");
    }
    Ok(())
}

#[tokio::test]
async fn every_answer_carries_the_security_headers() -> TestResult {
    let db = test_db().await?;
    let dash = Dashboard::start(&db, users()?).await?;
    for (path, user) in [("", ALICE), ("/api/stats", ALICE), ("", None)] {
        let res = dash.request(Method::GET, path, user).send().await?;
        let header = |name: &str| {
            res.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let csp = header("content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{csp}"
        );
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert_eq!(header("cache-control"), "no-store");
    }
    let html = dash.get_as("", ALICE).await?.1;
    assert!(!html.contains("<script>"), "no inline script");
    assert!(!html.contains("style="), "no inline style");
    Ok(())
}
