//! The demo's second service: the shipping service as a child process (this binary with
//! `--shipping-service`), on a database of its own, started once with `CRASH_AT=after_commit`
//! so that it dies after committing the first shipment and before answering the webhook.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use txoutbox::standard_webhooks::WebhookSecret;
use txoutbox_test_support::DemoDatabase;

use crate::demo::{count_eml, count_in, free_addr, var, ServiceProcess};

/// The shipping service of the demo: where it runs, what it is given, its process.
pub(crate) struct ShippingPeer {
    env: Vec<(String, String)>,
    addr: SocketAddr,
    database_url: String,
    mail_dir: Option<PathBuf>,
    _mail_tmp: Option<tempfile::TempDir>,
    process: Option<ServiceProcess>,
}

impl ShippingPeer {
    /// Chooses its database (`SHIPPING_DATABASE_URL`, else a database `shipping` on the demo's
    /// throwaway cluster, else the charge service's `DATABASE_URL`), its address, a fresh
    /// `whsec_` secret and its mail; adds `SHIPPING_URL` and `SHIPPING_WEBHOOK_SECRET` to the
    /// charge service's environment.
    pub(crate) async fn prepare(
        database: &DemoDatabase,
        charge_env: &mut Vec<(String, String)>,
    ) -> anyhow::Result<Self> {
        let database_url = match var("SHIPPING_DATABASE_URL") {
            Some(url) => url,
            None => match database.create_database("shipping").await? {
                Some(url) => url,
                None => database.url().to_owned(),
            },
        };
        let secret = WebhookSecret::from_bytes(
            [
                *uuid::Uuid::new_v4().as_bytes(),
                *uuid::Uuid::new_v4().as_bytes(),
            ]
            .concat(),
        )?
        .to_whsec();
        let addr = free_addr()?;
        let url = format!("http://{addr}/webhooks");
        let mut env = vec![
            ("DATABASE_URL".to_owned(), database_url.clone()),
            ("WEBHOOK_SECRET".to_owned(), secret.clone()),
        ];
        let (mail_dir, mail_tmp) = if var("SMTP_URL").is_some() {
            (None, None)
        } else {
            let tmp = tempfile::tempdir()?;
            env.push(("MAIL_DIR".into(), tmp.path().display().to_string()));
            (Some(tmp.path().to_path_buf()), Some(tmp))
        };
        println!("Shipping:  the shipping service at {url} (POST /webhooks, Standard Webhooks)");
        charge_env.push(("SHIPPING_URL".into(), url));
        charge_env.push(("SHIPPING_WEBHOOK_SECRET".into(), secret));
        Ok(Self {
            env,
            addr,
            database_url,
            mail_dir,
            _mail_tmp: mail_tmp,
            process: None,
        })
    }

    /// Starts the service; with `crash_after_commit`, it aborts after its first commit.
    pub(crate) async fn start(&mut self, crash_after_commit: bool) -> anyhow::Result<()> {
        let exe = std::env::current_exe()?;
        let mut env = self.env.clone();
        if crash_after_commit {
            env.push(("CRASH_AT".into(), "after_commit".into()));
        }
        let process = ServiceProcess::start(&exe, self.addr, &env, &["--shipping-service"])
            .await
            .context("starting the shipping service")?;
        self.process = Some(process);
        Ok(())
    }

    /// Waits (at most `limit`) for the service to die at its crash point.
    pub(crate) async fn wait_crash(
        &mut self,
        limit: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let process = self
            .process
            .as_mut()
            .context("the shipping service is not running")?;
        process.wait_exit(limit).await
    }

    /// `http://addr/webhooks`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}/webhooks", self.addr)
    }

    /// The shipments and the shipping emails written (`None` when they go over SMTP_URL).
    pub(crate) async fn written(&self) -> anyhow::Result<(i64, Option<usize>)> {
        let shipments = count_in(&self.database_url, "SELECT count(*) FROM shipments").await?;
        let emails = match &self.mail_dir {
            Some(dir) => Some(count_eml(dir)?),
            None => None,
        };
        Ok((shipments, emails))
    }

    /// Waits until a shipment exists and its email was written (by `deadline`).
    pub(crate) async fn wait_shipped(
        &self,
        deadline: Instant,
    ) -> anyhow::Result<(i64, Option<usize>)> {
        loop {
            let (shipments, emails) = self.written().await?;
            let done = shipments > 0 && emails.is_none_or(|n| n > 0);
            if done || Instant::now() > deadline {
                return Ok((shipments, emails));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the service.
    pub(crate) async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(process) = self.process.as_mut() {
            process.kill().await?;
        }
        Ok(())
    }
}
