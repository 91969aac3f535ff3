//! The checkout page in a real headless Chromium (Debian's chromium + chromium-driver, driven
//! over the W3C WebDriver protocol): a double click, a reload and a resubmit make one charge.

use serde_json::{json, Value};

use txoutbox_test_support::counts;
use txoutbox_test_support::select::column;
use txoutbox_test_support::webdriver::Driver;

mod common;

#[tokio::test(flavor = "multi_thread")]
async fn double_click_reload_and_resubmit_make_one_charge() -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    let mut driver = Driver::start(env!("CARGO_TARGET_TMPDIR")).await?;
    let session = driver.session(&[]).await?;

    session
        .post("/url", json!({"url": format!("{}/", server.base)}))
        .await?;
    let key = session.text("#key").await?;
    assert!(!key.is_empty(), "the page made a key when it rendered");

    // A double click: two submits before the first answer.
    session
        .post(
            "/execute/sync",
            json!({"script": "document.getElementById('pay').click(); document.getElementById('pay').click();", "args": []}),
        )
        .await?;
    let first = session.wait_for_text("#result", "HTTP 201").await?;

    // A reload keeps the key (sessionStorage) and the answer; a resubmit is answered again.
    session.post("/refresh", json!({})).await?;
    assert_eq!(session.text("#key").await?, key, "the reload kept the key");
    session.click("#pay").await?;
    let replayed = session.wait_for_text("#result", "(replayed)").await?;
    let charge_of = |text: &str| -> Option<String> {
        let body: Value = serde_json::from_str(text.split_once('\n')?.1).ok()?;
        body["charge_id"].as_str().map(str::to_owned)
    };
    assert_eq!(
        charge_of(&first),
        charge_of(&replayed),
        "the same charge shown again"
    );

    session.screenshot("charge-service-checkout.png").await?;
    session.close().await;

    assert_eq!(
        common::count(&server.pool, "SELECT count(*) FROM charges").await?,
        1
    );
    let conn = server.pool.get().await?;
    assert_eq!(counts(&conn).await?.keys, 1);
    // The page sends the key as an sf-string; the quotes are not part of the key.
    let stored: Vec<String> = column(&**conn, "SELECT key FROM txoutbox_idempotency_keys").await?;
    assert!(stored.iter().all(|k| !k.contains('"')), "{stored:?}");
    Ok(())
}
