//! A dashboard without users answers only requests addressed to a loopback name or address (or
//! an allowed host): a page of another site that rebinds its name to 127.0.0.1 (DNS rebinding)
//! reaches it from a visitor's browser as its own origin, under its own name.

mod support;

use base64::Engine as _;
use serde_json::json;
use support::Served;
use txoutbox_dashboard::{DashboardConfig, User};
use txoutbox_test_support::factory::message;
use txoutbox_test_support::rebound_pause;
use txoutbox_test_support::test_db_with_client;

type TestResult = anyhow::Result<()>;

const REBOUND: &str = "rebind.attacker.example";

/// Whether `destination` is paused, as every relay's claim would read it.
async fn is_paused(client: &tokio_postgres::Client, destination: &str) -> anyhow::Result<bool> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM txoutbox_destinations WHERE destination = $1 \
             AND paused_at IS NOT NULL",
            &[&destination],
        )
        .await?
        .is_some())
}

#[tokio::test]
async fn without_users_an_action_addressed_to_another_host_is_refused_421_and_changes_nothing(
) -> TestResult {
    let (db, client) = test_db_with_client().await?;
    let dash = Served::start(&db, DashboardConfig::default()).await?;
    // What a rebinding page sends from the visitor's browser: its own name, with the
    // dashboard's port, as the Host and the Origin; same-origin by the browser's reckoning.
    let host = format!("{REBOUND}:{}", dash.addr.port());

    let answer = dash.send_text(&rebound_pause("/outbox", &host)).await?;

    assert_eq!(answer.status, 421, "{answer:?}");
    assert!(
        answer.head.contains("application/problem+json"),
        "{answer:?}"
    );
    let problem: serde_json::Value = serde_json::from_str(&answer.body)?;
    assert_eq!(problem["status"], 421);
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("DNS rebinding") && detail.contains("--user"),
        "{detail}"
    );
    assert!(!is_paused(&client, "email").await?, "nothing paused");
    Ok(())
}

#[tokio::test]
async fn without_users_a_page_addressed_to_another_host_is_refused_421() -> TestResult {
    let (db, dash) = Served::on_a_test_db(DashboardConfig::default()).await?;
    let id = message(&db)
        .destination("email")
        .payload(json!({"order": 7}))
        .create()
        .await?;
    let port = dash.addr.port();

    for host in [
        format!("{REBOUND}:{port}"),
        REBOUND.to_owned(),
        format!("localhost.{REBOUND}:{port}"),
        format!("0.0.0.0:{port}"),
    ] {
        for path in [
            "".to_owned(),
            format!("/messages/{id}"),
            format!("/api/messages/{id}"),
            "/assets/live.js".to_owned(),
            "/no-such-page".to_owned(),
        ] {
            let answer = dash.send("GET", &path, &host, &[], "").await?;
            assert_eq!(answer.status, 421, "{host} {path}: {answer:?}");
            assert!(!answer.body.contains("order"), "{host} {path}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn without_users_loopback_names_and_addresses_are_answered_with_or_without_the_port(
) -> TestResult {
    let (_db, dash) = Served::on_a_test_db(DashboardConfig::default()).await?;
    let port = dash.addr.port();

    for host in [
        format!("localhost:{port}"),
        "localhost".to_owned(),
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_owned(),
        format!("[::1]:{port}"),
        "[::1]".to_owned(),
    ] {
        let answer = dash.send("GET", "/api/stats", &host, &[], "").await?;
        assert_eq!(answer.status, 200, "{host}: {answer:?}");
    }
    Ok(())
}

#[tokio::test]
async fn without_users_an_allowed_host_is_answered() -> TestResult {
    let (_db, dash) = Served::on_a_test_db(DashboardConfig {
        allowed_hosts: vec!["ops.example".into()],
        ..DashboardConfig::default()
    })
    .await?;

    let allowed = dash
        .send("GET", "/api/stats", "ops.example:443", &[], "")
        .await?;
    assert_eq!(allowed.status, 200, "{allowed:?}");
    let other = dash.send("GET", "/api/stats", REBOUND, &[], "").await?;
    assert_eq!(other.status, 421, "{other:?}");
    Ok(())
}

#[tokio::test]
async fn with_users_any_host_is_answered_once_signed_in_and_401_before() -> TestResult {
    let (_db, dash) = Served::on_a_test_db(DashboardConfig {
        users: vec![User::parse("alice:op-secret:operator")?],
        ..DashboardConfig::default()
    })
    .await?;
    let credentials = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("alice:op-secret")
    );

    // A rebinding page cannot send them: the browser keeps them for the real origin.
    let anonymous = dash.send("GET", "/api/stats", REBOUND, &[], "").await?;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let signed_in = dash
        .send(
            "GET",
            "/api/stats",
            "ops.example",
            &[("Authorization", &credentials)],
            "",
        )
        .await?;
    assert_eq!(signed_in.status, 200, "{signed_in:?}");
    Ok(())
}
