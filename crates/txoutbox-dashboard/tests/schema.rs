//! The dashboard nested in a service, on a database whose schema is not the one this build
//! reads: the sign-in comes first, then every page and API route answers 503 with the line that
//! says what to run, under the service's prefix.

use reqwest::StatusCode;
use txoutbox_dashboard::{DashboardConfig, User};
use txoutbox_test_support::http_client;
use txoutbox_test_support::serve_on_loopback;
use txoutbox_test_support::{drop_schema, latest_migration, test_db};

type TestResult = anyhow::Result<()>;

#[tokio::test]
async fn a_nested_dashboard_on_a_schema_behind_answers_503_with_the_line_to_signed_in_users(
) -> TestResult {
    let db = test_db().await?;
    drop_schema(&db.connect().await?).await?;
    let config = DashboardConfig {
        users: vec![User::parse("alice:pw:viewer")?],
        ..DashboardConfig::default()
    };
    let app = axum::Router::new().nest("/outbox", txoutbox_dashboard::router(db.pool(2)?, config));
    let (addr, server) = serve_on_loopback(app).await?;
    let base = format!("http://{addr}/outbox");
    let http = http_client()?;
    let required = latest_migration();
    let line = format!(
        "the database schema is at version 0, this txoutbox needs {required}: run `txoutbox migrate`"
    );

    let anonymous = http.get(format!("{base}/messages")).send().await?;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);

    let signed_in = |path: &str| {
        http.get(format!("{base}{path}"))
            .basic_auth("alice", Some("pw"))
            .send()
    };
    let page = signed_in("/messages").await?;
    assert_eq!(page.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(page.headers().contains_key("content-security-policy"));
    let page = page.text().await?;
    assert!(page.contains(&line), "{page}");
    assert!(
        page.contains("href=\"/outbox/assets/dashboard.css\""),
        "the page's links keep the prefix: {page}"
    );

    let api = signed_in("/api/messages").await?;
    assert_eq!(api.status(), StatusCode::SERVICE_UNAVAILABLE);
    let answer: serde_json::Value = api.json().await?;
    assert_eq!(answer["error"], line.as_str());
    server.abort();
    Ok(())
}
