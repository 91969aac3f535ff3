//! A service points the `type` of txoutbox's problems at its own documentation (each type with
//! its own title). Its own test binary: the base is set once per process.

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use serde_json::Value;
use txoutbox_axum::{set_problem_base, Idempotent};
use txoutbox_test_support::http_client;
use txoutbox_test_support::serve_on_loopback;

async fn accept(_request: Idempotent) -> StatusCode {
    StatusCode::NO_CONTENT
}

#[tokio::test]
async fn problem_types_resolve_under_the_configured_base() -> anyhow::Result<()> {
    let not_a_uri = set_problem_base("docs/errors#");
    assert!(
        matches!(&not_a_uri, Err(txoutbox::Error::Config(line)) if line.contains("problem type base")),
        "{not_a_uri:?}"
    );
    set_problem_base("https://docs.example.com/errors#")?;
    let again = set_problem_base("https://elsewhere.example.com/#");
    assert!(
        matches!(again, Err(txoutbox::Error::Config(_))),
        "{again:?}"
    );

    let router = Router::new().route("/orders", post(accept));
    let (addr, _) = serve_on_loopback(router).await?;
    let base = format!("http://{addr}");
    let http = http_client()?;
    let missing = http.post(format!("{base}/orders")).send().await?;
    assert_eq!(missing.status(), 400);
    assert_eq!(
        missing.headers()["content-type"],
        txoutbox_axum::PROBLEM_JSON
    );
    let body: Value = missing.json().await?;
    assert_eq!(
        body["type"],
        "https://docs.example.com/errors#problem-missing-key"
    );
    // A documented type has its own title, not the status phrase of `about:blank`.
    assert_eq!(body["title"], "Idempotency-Key required");
    let accepted = http
        .post(format!("{base}/orders"))
        .header(
            "Idempotency-Key",
            "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
        )
        .send()
        .await?;
    assert_eq!(accepted.status(), 204);
    Ok(())
}
