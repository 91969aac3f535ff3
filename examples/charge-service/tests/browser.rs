//! The checkout page in a real headless Chromium (Debian's chromium + chromium-driver, driven
//! over the W3C WebDriver protocol): a double click, a reload and a resubmit make one charge.

use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

mod common;

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

struct Driver {
    http: reqwest::Client,
    base: String,
    _process: tokio::process::Child,
}

impl Driver {
    async fn start() -> anyhow::Result<Self> {
        let port = charge_service::free_addr()?.port();
        let process = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!("chromedriver (apt-get install chromium chromium-driver): {e}")
            })?;
        let driver = Self {
            http: charge_service::reqwest_client()?,
            base: format!("http://127.0.0.1:{port}"),
            _process: process,
        };
        let started = Instant::now();
        while driver
            .http
            .get(format!("{}/status", driver.base))
            .send()
            .await
            .is_err()
        {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(driver)
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request
            .timeout(Duration::from_secs(30))
            .send()
            .await?
            .json()
            .await?;
        anyhow::ensure!(
            answer["value"]["error"].is_null(),
            "webdriver {path}: {answer}"
        );
        Ok(answer["value"].clone())
    }
}

struct Session<'d> {
    driver: &'d Driver,
    id: String,
}

impl Session<'_> {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}{path}", self.id),
                Some(body),
            )
            .await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.driver
            .call(
                reqwest::Method::GET,
                &format!("/session/{}{path}", self.id),
                None,
            )
            .await
    }

    async fn element(&self, css: &str) -> anyhow::Result<String> {
        let found = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await?;
        Ok(found[ELEMENT].as_str().unwrap_or_default().to_owned())
    }

    async fn text(&self, css: &str) -> anyhow::Result<String> {
        let id = self.element(css).await?;
        Ok(self
            .get(&format!("/element/{id}/text"))
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    async fn click(&self, css: &str) -> anyhow::Result<()> {
        let id = self.element(css).await?;
        self.post(&format!("/element/{id}/click"), json!({}))
            .await?;
        Ok(())
    }

    async fn wait_for_text(&self, css: &str, wanted: &str) -> anyhow::Result<String> {
        let started = Instant::now();
        loop {
            let text = self.text(css).await?;
            if text.contains(wanted) {
                return Ok(text);
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(20),
                "{css} shows {text:?}, not {wanted:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn double_click_reload_and_resubmit_make_one_charge() -> anyhow::Result<()> {
    let (_db, server) = common::db_and_server().await?;
    let profile = tempfile::tempdir()?;
    let driver = Driver::start().await?;
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([format!("--user-data-dir={}", profile.path().display())])
    .collect::<Vec<_>>();
    let session = driver
        .call(
            reqwest::Method::POST,
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
            }}})),
        )
        .await?;
    let session = Session {
        driver: &driver,
        id: session["sessionId"].as_str().unwrap_or_default().to_owned(),
    };

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

    let png = session.get("/screenshot").await?;
    let png = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap_or_default())?;
    let path =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("charge-service-checkout.png");
    std::fs::write(&path, png)?;
    println!("screenshot: {}", path.display());
    let _ = driver
        .call(
            reqwest::Method::DELETE,
            &format!("/session/{}", session.id),
            None,
        )
        .await;

    assert_eq!(
        common::count(&server.pool, "SELECT count(*) FROM charges").await?,
        1
    );
    assert_eq!(
        common::count(
            &server.pool,
            "SELECT count(*) FROM txoutbox_idempotency_keys"
        )
        .await?,
        1
    );
    // The page sends the key as an sf-string; the quotes are not part of the key.
    assert_eq!(
        common::count(
            &server.pool,
            "SELECT count(*) FROM txoutbox_idempotency_keys WHERE key NOT LIKE '%\"%'"
        )
        .await?,
        1
    );
    Ok(())
}
