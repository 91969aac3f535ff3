//! Redaction fails closed on every page and API answer: hostile stored documents (planted with
//! SQL, as another program could write them) are withheld rather than shown raw, free text is
//! scrubbed, and the error-text search cannot confirm a hidden value.

mod support;

use serde_json::json;
use support::Served;
use tokio_postgres::Client;
use txoutbox::admin::MessageStatus;
use txoutbox_dashboard::DashboardConfig;
use txoutbox_test_support::factory::{message, nested_too_deep};
use txoutbox_test_support::select::value_with;
use txoutbox_test_support::{test_db, test_db_with_client, test_db_with_sql};
use uuid::Uuid;

type TestResult = anyhow::Result<()>;

const SECRET: &str = "carol@example.com";

fn redacting(fields: &[&str]) -> DashboardConfig {
    DashboardConfig {
        redact: fields.iter().map(|f| (*f).to_owned()).collect(),
        ..DashboardConfig::default()
    }
}

/// A completed key row whose stored response body is `body`, as any program could store it.
async fn key_with_body(client: &Client, key: &str, body: &[u8]) -> TestResult {
    client
        .execute(
            "INSERT INTO txoutbox_idempotency_keys (scope, key, fingerprint, state, \
                 response_status, response_headers, response_body, expires_at) \
             VALUES ('charges', $1, '\\x00', 'completed', 201, \
                 '[[\"content-type\", \"application/json\"], [\"email\", \"carol@example.com\"]]', \
                 $2, now() + interval '1 day')",
            &[&key, &body],
        )
        .await?;
    Ok(())
}

/// A failed row with `payload` and `error` as its last error and its one attempt's.
async fn failed_with(
    client: &mut Client,
    payload: serde_json::Value,
    error: &str,
) -> anyhow::Result<Uuid> {
    let id = message(&mut *client)
        .destination("email")
        .payload(payload)
        .status(MessageStatus::Failed)
        .attempts(1)
        .last_error(error)
        .create()
        .await?;
    client
        .execute(
            "INSERT INTO txoutbox_attempts (message_id, attempt, downstream_key, relay, outcome, \
                 error, receipt, started_at) \
             SELECT id, 1, downstream_key, 'relay-1', 'failed', $2, $2, now() \
             FROM txoutbox_messages WHERE id = $1",
            &[&id, &error],
        )
        .await?;
    Ok(id)
}

/// A failed email row whose error is the 550 "mailbox unavailable" of `address`.
async fn unavailable(client: &mut Client, address: &str) -> anyhow::Result<Uuid> {
    let error = format!("550 <{address}> mailbox unavailable");
    failed_with(client, json!({}), &error).await
}

#[tokio::test]
async fn a_stored_response_body_that_cannot_be_redacted_is_withheld_on_the_keys_page_and_api(
) -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let deep = format!(
        "{}{{\"email\":\"{SECRET}\"}}{}",
        "[".repeat(200),
        "]".repeat(200)
    );
    let bodies: [(&str, &[u8]); 3] = [
        // Valid JSON that serde_json refuses (a number out of its range).
        (
            "out-of-range",
            br#"{"email":"carol@example.com","n":1e400}"#,
        ),
        ("not-json", b"email=carol@example.com&n=1"),
        ("too-deep", deep.as_bytes()),
    ];
    for (key, body) in bodies {
        key_with_body(&client, key, body).await?;
    }
    let dash = Served::start(&db, redacting(&["email"])).await?;

    for (key, _) in bodies {
        let html = dash.page(&format!("/keys?scope=charges&key={key}")).await?;
        let api = dash
            .page(&format!("/api/keys?scope=charges&key={key}"))
            .await?;
        for answer in [&html, &api] {
            assert!(!answer.contains(SECRET), "{key} leaked: {answer}");
            assert!(
                answer.contains("withheld: cannot be redacted"),
                "{key}: {answer}"
            );
        }
        assert!(html.contains("application/json"), "other headers stay");
    }
    Ok(())
}

#[tokio::test]
async fn a_stored_response_body_is_shown_as_stored_when_nothing_is_redacted() -> TestResult {
    let (db, client) = test_db_with_client().await?;
    key_with_body(&client, "plain", b"ok: carol").await?;
    let dash = Served::start(&db, DashboardConfig::default()).await?;

    let api: serde_json::Value =
        serde_json::from_str(&dash.page("/api/keys?scope=charges&key=plain").await?)?;
    assert_eq!(api["response_body"], "ok: carol");
    Ok(())
}

/// The core hands such a payload over as its stored text; the dashboard cannot redact it, so it
/// withholds it, and the page and the API still answer.
#[tokio::test]
async fn a_payload_serde_json_refuses_is_withheld_while_redacting() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = failed_with(&mut client, json!({}), "timeout").await?;
    // Postgres keeps 1e400 (a numeric); serde_json cannot hold it.
    client
        .execute(
            "UPDATE txoutbox_messages SET payload = \
                 '{\"email\": \"carol@example.com\", \"n\": 1e400}'::jsonb WHERE id = $1",
            &[&id],
        )
        .await?;
    let dash = Served::start(&db, redacting(&["email"])).await?;

    for path in [format!("/messages/{id}"), format!("/api/messages/{id}")] {
        let answer = dash.get(&path).await?;
        assert!(!answer.body.contains(SECRET), "{path} leaked: {answer:?}");
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
        assert!(
            answer.body.contains("withheld: cannot be redacted"),
            "{path}: {answer:?}"
        );
        assert!(
            answer.body.contains("the payload cannot be decoded"),
            "marked: {path}: {answer:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_payload_serde_json_refuses_is_shown_as_stored_and_marked_when_nothing_is_redacted(
) -> TestResult {
    let db = test_db().await?;
    let deep = nested_too_deep();
    let id = message(&db)
        .stored_payload(&deep)
        .stored_headers(r#"{"traceparent": 7}"#)
        .status(MessageStatus::Failed)
        .create()
        .await?;
    let dash = Served::start(&db, DashboardConfig::default()).await?;

    let html = dash.page(&format!("/messages/{id}")).await?;
    assert!(html.contains(&deep), "the stored text is shown: {html}");
    assert!(
        html.contains("the payload cannot be decoded: recursion limit exceeded"),
        "{html}"
    );
    assert!(html.contains("the headers cannot be decoded"), "{html}");
    let api: serde_json::Value =
        serde_json::from_str(&dash.page(&format!("/api/messages/{id}")).await?)?;
    assert_eq!(api["payload"], deep.as_str());
    assert_eq!(
        api["headers"], r#"{"traceparent": 7}"#,
        "valid JSON, not an object of strings: as stored"
    );
    assert_eq!(
        api["undecodable"].as_array().map(Vec::len),
        Some(2),
        "{api}"
    );
    Ok(())
}

#[tokio::test]
async fn a_messages_error_text_is_scrubbed_of_its_own_hidden_values_and_of_addresses() -> TestResult
{
    let (db, mut client) = test_db_with_client().await?;
    let error = "550 <alice@example.com> mailbox unavailable for Alice Smith, cc bob@other.example";
    let id = failed_with(
        &mut client,
        json!({"email": "alice@example.com", "name": "Alice Smith", "order": 7}),
        error,
    )
    .await?;
    let dash = Served::start(&db, redacting(&["email", "name"])).await?;

    let html = dash.page(&format!("/messages/{id}")).await?;
    let api = dash.page(&format!("/api/messages/{id}")).await?;
    for answer in [&html, &api] {
        for secret in ["alice@example.com", "Alice Smith", "bob@other.example"] {
            assert!(!answer.contains(secret), "{secret} leaked: {answer}");
        }
        assert!(
            answer.contains(
                "550 &lt;[redacted]&gt; mailbox unavailable for [redacted], cc [redacted]"
            ) || answer
                .contains("550 <[redacted]> mailbox unavailable for [redacted], cc [redacted]"),
            "{answer}"
        );
    }
    let api: serde_json::Value = serde_json::from_str(&api)?;
    assert_eq!(api["history"][0]["receipt"], api["history"][0]["error"]);
    assert_eq!(api["payload"]["order"], 7, "other fields stay");
    Ok(())
}

#[tokio::test]
async fn lists_and_failure_groups_scrub_email_addresses_from_error_text() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    unavailable(&mut client, "alice@example.com").await?;
    unavailable(&mut client, "bob@example.com").await?;
    let dash = Served::start(&db, redacting(&["email"])).await?;

    for path in ["/messages", "/api/messages", "/failures"] {
        let answer = dash.page(path).await?;
        for secret in ["alice@example.com", "bob@example.com"] {
            assert!(
                !answer.contains(secret),
                "{path}: {secret} leaked: {answer}"
            );
        }
        assert!(answer.contains("[redacted]"), "{path}: {answer}");
    }
    Ok(())
}

#[tokio::test]
async fn failures_to_two_addresses_form_one_group_whose_link_lists_both() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let a = unavailable(&mut client, "alice@example.com").await?;
    let b = unavailable(&mut client, "bob@example.com").await?;
    let dash = Served::start(&db, redacting(&["email"])).await?;

    let html = dash.page("/failures").await?;
    let link = "error_class=550+%3C%3Cemail%3E%3E+mailbox+unavailable";
    assert!(html.contains(&format!(r#"{link}">2</a>"#)), "{html}");
    let list = dash
        .page(&format!("/messages?status=failed&destination=email&{link}"))
        .await?;
    for id in [a, b] {
        assert!(list.contains(&id.to_string()), "{id}: {list}");
    }
    Ok(())
}

#[tokio::test]
async fn the_error_text_search_is_refused_while_fields_are_redacted_and_acts_on_nothing(
) -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    let id = unavailable(&mut client, "alice@example.com").await?;
    let dash = Served::start(&db, redacting(&["email"])).await?;

    for path in [
        "/messages?error=alice%40example.com",
        "/api/messages?error=alice%40example.com",
    ] {
        let answer = dash.get(path).await?;
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
        assert!(answer.body.contains("error-text search"), "{answer:?}");
    }
    let replay = dash
        .post_json(
            "/api/replay",
            r#"{"filter": {"error": "alice@example.com"}, "dry_run": true}"#,
        )
        .await?;
    assert_eq!(replay.status, 400, "{replay:?}");
    let status: String = value_with(
        &client,
        "SELECT status FROM txoutbox_messages WHERE id = $1",
        &[&id],
    )
    .await?;
    assert_eq!(status, "failed");
    assert!(
        !dash.page("/messages").await?.contains(r#"name="error""#),
        "no search field"
    );
    Ok(())
}

#[tokio::test]
async fn a_breakers_reason_is_scrubbed_on_the_overview_and_in_the_api() -> TestResult {
    let (db, _) = test_db_with_sql(
        "INSERT INTO txoutbox_destinations (destination, breaker, failures, open_until, \
                 open_reason) \
             VALUES ('email', 'open', 10, now() + interval '1 hour', \
                 '550 <carol@example.com> mailbox unavailable')",
    )
    .await?;
    let dash = Served::start(&db, redacting(&["email"])).await?;

    for path in ["", "/api/destinations", "/api/stats"] {
        let answer = dash.page(path).await?;
        assert!(!answer.contains(SECRET), "{path} leaked: {answer}");
        assert!(answer.contains("mailbox unavailable"), "{path}: {answer}");
    }
    Ok(())
}

/// A completed key row whose stored response headers are `headers` (JSON text).
async fn key_with_headers(client: &Client, key: &str, headers: &str) -> TestResult {
    client
        .execute(
            "INSERT INTO txoutbox_idempotency_keys (scope, key, fingerprint, state, \
                 response_status, response_headers, response_body, expires_at) \
             VALUES ('charges', $1, '\\x00', 'completed', 201, $2::text::jsonb, '{}', \
                 now() + interval '1 day')",
            &[&key, &headers],
        )
        .await?;
    Ok(())
}

/// Stored response headers txoutbox cannot decode: too deep for serde_json, and valid JSON of
/// another shape than [name, value] pairs.
async fn keys_with_undecodable_headers(client: &Client) -> anyhow::Result<[&'static str; 2]> {
    let deep = format!(
        "[[\"email\", \"{SECRET}\"], {}1{}]",
        "[".repeat(200),
        "]".repeat(200)
    );
    key_with_headers(client, "headers-too-deep", &deep).await?;
    key_with_headers(
        client,
        "headers-shape",
        &format!("[[\"email\", \"{SECRET}\"], 5]"),
    )
    .await?;
    Ok(["headers-too-deep", "headers-shape"])
}

#[tokio::test]
async fn stored_response_headers_that_cannot_be_decoded_are_shown_as_stored_and_marked(
) -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let keys = keys_with_undecodable_headers(&client).await?;
    let dash = Served::start(&db, DashboardConfig::default()).await?;

    for key in keys {
        let html = dash.page(&format!("/keys?scope=charges&key={key}")).await?;
        assert!(
            html.contains("the response headers cannot be decoded"),
            "{key}: {html}"
        );
        assert!(html.contains(SECRET), "{key}: shown as stored: {html}");
        let api: serde_json::Value = serde_json::from_str(
            &dash
                .page(&format!("/api/keys?scope=charges&key={key}"))
                .await?,
        )?;
        assert!(
            api["response_headers"]["text"]
                .as_str()
                .is_some_and(|t| t.contains(SECRET)),
            "{key}: {api}"
        );
        assert!(api["response_headers"]["undecodable"].is_string(), "{api}");
    }
    Ok(())
}

#[tokio::test]
async fn stored_response_headers_that_cannot_be_decoded_are_withheld_while_redacting() -> TestResult
{
    let (db, client) = test_db_with_client().await?;
    let keys = keys_with_undecodable_headers(&client).await?;
    let dash = Served::start(&db, redacting(&["email"])).await?;

    for key in keys {
        for path in [
            format!("/keys?scope=charges&key={key}"),
            format!("/api/keys?scope=charges&key={key}"),
        ] {
            let answer = dash.get(&path).await?;
            assert_eq!(answer.status, 200, "{path}: {answer:?}");
            assert!(!answer.body.contains(SECRET), "{path} leaked: {answer:?}");
            assert!(
                answer.body.contains("withheld: cannot be redacted"),
                "{path}: {answer:?}"
            );
        }
    }
    Ok(())
}
