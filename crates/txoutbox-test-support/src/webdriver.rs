//! A WebDriver client for browser tests: Debian's headless chromium, driven by chromedriver over
//! the W3C WebDriver protocol (`apt-get install chromium chromium-driver`), each session with a
//! throwaway profile of its own.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Result;
use base64::Engine;
use serde_json::{json, Value};

use crate::free_port;

/// The key under which WebDriver answers an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The chromium flags every session starts with: headless, quiet, reproducible.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
];

/// A running chromedriver on a free loopback port; killed when dropped.
pub struct Driver {
    http: reqwest::Client,
    base: String,
    screenshots: PathBuf,
    _process: tokio::process::Child,
    _profiles: Vec<tempfile::TempDir>,
}

impl Driver {
    /// Starts chromedriver and waits (up to 20 s) until it answers; screenshots go to
    /// `screenshots` (a test passes `env!("CARGO_TARGET_TMPDIR")`).
    pub async fn start(screenshots: impl Into<PathBuf>) -> Result<Self> {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let port = free_port()?;
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
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            base: format!("http://127.0.0.1:{port}"),
            screenshots: screenshots.into(),
            _process: process,
            _profiles: Vec::new(),
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

    /// One WebDriver command; its `value`, or an error if WebDriver answered one.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await?.json().await?;
        anyhow::ensure!(
            answer["value"]["error"].is_null(),
            "webdriver {path}: {answer}"
        );
        Ok(answer["value"].clone())
    }

    /// A new browser session with a fresh profile, started with `CHROMIUM_ARGS` and
    /// `extra_args` (such as `--window-size=1100,760`).
    pub async fn session(&mut self, extra_args: &[&str]) -> Result<Session<'_>> {
        let profile = tempfile::tempdir()?;
        let args = CHROMIUM_ARGS
            .iter()
            .chain(extra_args)
            .map(|a| a.to_string())
            .chain([format!("--user-data-dir={}", profile.path().display())])
            .collect::<Vec<_>>();
        self._profiles.push(profile);
        let session = self
            .call(
                reqwest::Method::POST,
                "/session",
                Some(json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
                }}})),
            )
            .await?;
        Ok(Session {
            driver: self,
            id: session["sessionId"].as_str().unwrap_or_default().to_owned(),
        })
    }
}

/// One browser session (a window with its own profile).
pub struct Session<'d> {
    driver: &'d Driver,
    id: String,
}

impl Session<'_> {
    /// POST a session command.
    pub async fn post(&self, path: &str, body: Value) -> Result<Value> {
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}{path}", self.id),
                Some(body),
            )
            .await
    }

    /// GET a session command.
    pub async fn get(&self, path: &str) -> Result<Value> {
        self.driver
            .call(
                reqwest::Method::GET,
                &format!("/session/{}{path}", self.id),
                None,
            )
            .await
    }

    /// Navigates to `url`.
    pub async fn open(&self, url: &str) -> Result<()> {
        self.post("/url", json!({ "url": url })).await?;
        Ok(())
    }

    /// The reference of the first element `css` selects.
    pub async fn element(&self, css: &str) -> Result<String> {
        let found = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await?;
        Ok(found[ELEMENT].as_str().unwrap_or_default().to_owned())
    }

    /// The rendered text of the first element `css` selects.
    pub async fn text(&self, css: &str) -> Result<String> {
        let id = self.element(css).await?;
        Ok(self
            .get(&format!("/element/{id}/text"))
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// Fails unless the text of the element `css` selects contains `expected`, naming both.
    pub async fn expect_text(&self, css: &str, expected: &str) -> Result<()> {
        let text = self.text(css).await?;
        anyhow::ensure!(
            text.contains(expected),
            "{css} shows {text:?}, not {expected:?}"
        );
        Ok(())
    }

    /// Clicks the first element `css` selects.
    pub async fn click(&self, css: &str) -> Result<()> {
        let id = self.element(css).await?;
        self.post(&format!("/element/{id}/click"), json!({}))
            .await?;
        Ok(())
    }

    /// Runs `script` in the page; its return value.
    pub async fn script(&self, script: &str) -> Result<Value> {
        self.post("/execute/sync", json!({"script": script, "args": []}))
            .await
    }

    /// Runs `script` in the page and waits for it to call its callback; the value passed.
    pub async fn async_script(&self, script: &str) -> Result<Value> {
        self.post("/execute/async", json!({"script": script, "args": []}))
            .await
    }

    /// The page's current source.
    pub async fn source(&self) -> Result<String> {
        Ok(self
            .get("/source")
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// Saves a PNG of the window as `name` in the driver's screenshot folder.
    pub async fn screenshot(&self, name: &str) -> Result<()> {
        let png = self.get("/screenshot").await?;
        let png =
            base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap_or_default())?;
        let path = self.driver.screenshots.join(name);
        std::fs::write(&path, png)?;
        println!("screenshot: {}", path.display());
        Ok(())
    }

    /// Ends the session (closes the window).
    pub async fn close(self) {
        let _ = self
            .driver
            .call(
                reqwest::Method::DELETE,
                &format!("/session/{}", self.id),
                None,
            )
            .await;
    }
}

impl Session<'_> {
    /// Waits, without navigating, until the first element `css` selects shows `wanted`, and
    /// returns the text it shows; fails naming what it showed last when
    /// [`WAIT_LIMIT`](crate::WAIT_LIMIT) passes first. An element a live refresh swapped out
    /// between finding and reading it (a stale element) is read again on the next round.
    pub async fn wait_for_text(&self, css: &str, wanted: &str) -> Result<String> {
        let started = std::time::Instant::now();
        loop {
            let seen = match self.text(css).await {
                Ok(text) if text.contains(wanted) => return Ok(text),
                Ok(text) => format!("{text:?}"),
                Err(e) => e.to_string(),
            };
            anyhow::ensure!(
                started.elapsed() < crate::WAIT_LIMIT,
                "{css} still shows {seen}, not {wanted:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Counts, in the page, the live-refresh ticks that found the page busy or refreshed it
    /// (each asks whether a form is open in a live section); read with [`Self::live_ticks`].
    pub async fn count_live_ticks(&self) -> Result<()> {
        self.script(
            "window.__liveTicks = 0; var q = document.querySelector.bind(document); \
             document.querySelector = function (s) { \
               if (s === '[data-live] details[open]') window.__liveTicks += 1; return q(s); }; \
             return null;",
        )
        .await?;
        Ok(())
    }

    /// The live-refresh ticks counted since [`Self::count_live_ticks`].
    pub async fn live_ticks(&self) -> Result<u64> {
        let ticks = self.script("return window.__liveTicks || 0;").await?;
        Ok(ticks.as_u64().unwrap_or(0))
    }
}
