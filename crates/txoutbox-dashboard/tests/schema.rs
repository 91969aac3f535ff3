//! The dashboard nested in a service, on a database whose schema is not the one this build
//! reads: the sign-in comes first, then every page and API route answers 503 with the line that
//! says what to run, under the service's prefix.

use std::time::Duration;

use reqwest::StatusCode;
use txoutbox_dashboard::{DashboardConfig, User};
use txoutbox_test_support::{drop_schema, test_db};

type TestResult = anyhow::Result<()>;

#[tokio::test]
async fn a_nested_dashboard_on_a_schema_behind_answers_503_with_the_line_to_signed_in_users(
) -> TestResult {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let db = test_db().await?;
    drop_schema(&db.connect().await?).await?;
    let config = DashboardConfig {
        users: vec![User::parse("alice:pw:viewer")?],
        ..DashboardConfig::default()
    };
    let app = axum::Router::new().nest("/outbox", txoutbox_dashboard::router(db.pool(2)?, config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/outbox", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let required = txoutbox::admin::embedded_migrations()
        .last()
        .map_or(0, |(version, _, _)| *version);
    let line = format!(
        "the database schema is at version 0, this txoutbox needs {required}: run `txoutbox migrate`"
    );

    let anonymous = http.get(format!("{base}/messages")).send().await?;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);

    let page = http
        .get(format!("{base}/messages"))
        .basic_auth("alice", Some("pw"))
        .send()
        .await?;
    assert_eq!(page.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(page.headers().contains_key("content-security-policy"));
    let page = page.text().await?;
    assert!(page.contains(&line), "{page}");
    assert!(
        page.contains("href=\"/outbox/assets/dashboard.css\""),
        "the page's links keep the prefix: {page}"
    );

    let api = http
        .get(format!("{base}/api/messages"))
        .basic_auth("alice", Some("pw"))
        .send()
        .await?;
    assert_eq!(api.status(), StatusCode::SERVICE_UNAVAILABLE);
    let answer: serde_json::Value = api.json().await?;
    assert_eq!(answer["error"], line.as_str());
    server.abort();
    Ok(())
}
