//! `charge-service --demo`: a charge request, the server killed mid-request (after its commit),
//! the client retrying with the same key against a restarted server, the relay delivering, the
//! chain's next hop (the shipping service killed after its commit, the webhook redelivered with
//! the same `webhook-id`), and a count of what exists. Also [`ServiceProcess`], the child
//! process the demo and tests run.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use txoutbox_client::{IdempotentClient, RetryPolicy};
use txoutbox_test_support::process::service_command;
use txoutbox_test_support::{fake_stripe::FakeStripe, DemoDatabase};

use crate::chain::ShippingPeer;

/// The service binary running as a child process; killed when dropped.
#[derive(Debug)]
pub struct ServiceProcess {
    child: tokio::process::Child,
    addr: SocketAddr,
}

impl ServiceProcess {
    /// Starts `exe` with `env` (DATABASE_URL, STRIPE_*, SMTP_URL|MAIL_DIR, CRASH_AT...) on `addr`
    /// and waits until it accepts connections (at most 30 s).
    pub async fn start(
        exe: &std::path::Path,
        addr: SocketAddr,
        env: &[(String, String)],
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let mut child = service_command(exe, &addr.to_string(), env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let started = Instant::now();
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(Self { child, addr });
            }
            if let Some(status) = child.try_wait()? {
                bail!("the service exited at start: {status}");
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("the service did not listen on {addr} within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://addr`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits for the process to end by itself (a crash point), at most `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<std::process::ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .context("the service did not exit")?
            .context("waiting for the service")
    }

    /// Kills the process and waits for it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        Ok(())
    }
}

/// A free loopback port (bound and released; the child binds it next).
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

pub(crate) fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// What the demo runs against: Postgres, Stripe and mail, its own unless the environment names
/// them, and the environment the service processes get.
struct Peers {
    env: Vec<(String, String)>,
    database_url: String,
    /// The throwaway cluster's URL, to print (none when DATABASE_URL was given).
    own_database: Option<String>,
    fake: Option<FakeStripe>,
    mail_dir: Option<PathBuf>,
    database: DemoDatabase,
    _mail_tmp: Option<tempfile::TempDir>,
}

impl Peers {
    async fn start() -> anyhow::Result<Self> {
        let mut env = Vec::new();
        let database = DemoDatabase::from_env()?;
        let database_url = database.url().to_owned();
        let own_database = database.throwaway_url();
        match &own_database {
            None => println!("Postgres:  DATABASE_URL"),
            Some(_) => println!("Postgres:  a throwaway cluster"),
        }
        env.push(("DATABASE_URL".to_owned(), database_url.clone()));
        let fake = if var("STRIPE_SECRET_KEY").is_some() {
            println!("Stripe:    STRIPE_SECRET_KEY / STRIPE_API_BASE");
            None
        } else {
            let fake = FakeStripe::start().await?;
            println!("Stripe:    the fake Stripe API at {}", fake.base_url());
            env.push(("STRIPE_SECRET_KEY".into(), fake.secret_key().into()));
            env.push(("STRIPE_API_BASE".into(), fake.base_url()));
            Some(fake)
        };
        let (mail_dir, mail_tmp) = mail_dir(&mut env)?;
        Ok(Self {
            env,
            database_url,
            own_database,
            fake,
            mail_dir,
            database,
            _mail_tmp: mail_tmp,
        })
    }
}

/// Where the receipts go: SMTP_URL, MAIL_DIR, or a temporary directory of `.eml` files.
fn mail_dir(
    env: &mut Vec<(String, String)>,
) -> anyhow::Result<(Option<PathBuf>, Option<tempfile::TempDir>)> {
    if var("SMTP_URL").is_some() {
        println!("Mail:      SMTP_URL");
        return Ok((None, None));
    }
    if let Some(dir) = var("MAIL_DIR") {
        println!("Mail:      MAIL_DIR={dir}");
        return Ok((Some(PathBuf::from(dir)), None));
    }
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    println!("Mail:      .eml files in {}", dir.display());
    env.push(("MAIL_DIR".into(), dir.display().to_string()));
    Ok((Some(dir), Some(tmp)))
}

/// What the story ends with.
struct Story {
    server: ServiceProcess,
    key: String,
    charge_id: String,
    attempts: u32,
    shown: serde_json::Value,
    emails: Option<usize>,
}

/// Plays the demo; returns when done (bounded: every wait has a limit). With `keep`, the
/// service (with its relay and dashboard) and the throwaway Postgres stay up afterwards until
/// SIGINT or SIGTERM.
pub async fn run_demo(keep: bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(110);
    let mut peers = Peers::start().await?;
    let addr = free_addr()?;
    let password = uuid::Uuid::new_v4().simple().to_string();
    peers
        .env
        .push(("DASHBOARD_USERS".into(), format!("ops:{password}:operator")));
    let dashboard = format!("http://{addr}/outbox (user ops, password {password})");
    if keep {
        println!("Dashboard: {dashboard}, up until Ctrl-C");
    } else {
        println!("Dashboard: {dashboard} while the demo runs (--keep keeps it up)");
    }
    let mut shipping = ShippingPeer::prepare(&peers.database, &mut peers.env).await?;
    println!("   The shipping service starts with CRASH_AT=after_commit: it will die after committing its first shipment, before answering.");
    shipping.start(true).await?;
    let mut story = play(&peers, addr, deadline).await?;
    let hop = next_hop(&peers, &mut shipping, &story, deadline).await?;
    report(&peers, &story).await?;
    report_hop(&hop);
    if keep {
        println!("\nShipping service: {} (POST /webhooks)", shipping.url());
        keep_up(&peers, &story.server, &dashboard).await?;
    }
    story.server.kill().await?;
    shipping.kill().await?;
    if story.shown["status"] != "succeeded" {
        bail!("the charge did not succeed: {}", story.shown);
    }
    if hop.shipments != 1 {
        bail!(
            "the shipping service made {} shipments, not 1",
            hop.shipments
        );
    }
    Ok(())
}

/// Steps 1 to 6: the crash after commit, the retry under the same key, the relay's delivery.
async fn play(peers: &Peers, addr: SocketAddr, deadline: Instant) -> anyhow::Result<Story> {
    let exe = std::env::current_exe()?;
    println!("\n1. The service starts with CRASH_AT=after_commit: it will die after committing the charge, before answering.");
    let mut crash_env = peers.env.clone();
    crash_env.push(("CRASH_AT".into(), "after_commit".into()));
    let mut server = ServiceProcess::start(&exe, addr, &crash_env, &[]).await?;
    let client = IdempotentClient::new(RetryPolicy {
        deadline: Duration::from_secs(60),
        attempt_timeout: Duration::from_secs(5),
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_millis(500),
        max_attempts: 100,
    })?;
    let key = client.operation().key().to_owned();
    let url = format!("{}/charge", server.base_url());
    let body = serde_json::json!({
        "customer_id": "cus_demo",
        "amount": 2000,
        "currency": "usd",
        "email": "ada@example.org",
    });
    println!("2. The client POSTs /charge with Idempotency-Key {key}.");
    let request = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move { client.operation_with_key(key).post_json(&url, &body).await })
    };
    let status = server.wait_exit(Duration::from_secs(30)).await?;
    println!("3. The server died mid-request ({status}); the client's answer was lost, it keeps retrying.");
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("4. The service restarts (no CRASH_AT).");
    let server = ServiceProcess::start(&exe, addr, &peers.env, &[]).await?;
    let outcome = request.await??;
    println!(
        "5. The client got HTTP {} after {} attempts{}: {}",
        outcome.status.as_u16(),
        outcome.attempts,
        if outcome.replayed() {
            " (Idempotent-Replayed: true)"
        } else {
            ""
        },
        String::from_utf8_lossy(&outcome.body)
    );
    let answer: serde_json::Value = outcome.json()?;
    let charge_id = answer["charge_id"]
        .as_str()
        .context("no charge_id in the answer")?
        .to_owned();
    println!("6. The relay delivers the PaymentIntent and the receipt...");
    let (shown, emails) = delivered(peers, &server, &charge_id, deadline).await?;
    println!(
        "   charge {charge_id} is {}, stripe id {}",
        shown["status"], shown["stripe_id"]
    );
    Ok(Story {
        server,
        key,
        charge_id,
        attempts: outcome.attempts,
        shown,
        emails,
    })
}

/// The charge once it is no longer pending, and the receipts written (by the deadline).
async fn delivered(
    peers: &Peers,
    server: &ServiceProcess,
    charge_id: &str,
    deadline: Instant,
) -> anyhow::Result<(serde_json::Value, Option<usize>)> {
    let http = reqwest_client()?;
    let shown = loop {
        let shown: serde_json::Value = http
            .get(format!("{}/charges/{charge_id}", server.base_url()))
            .send()
            .await?
            .json()
            .await?;
        if shown["status"] != "pending" || Instant::now() > deadline {
            break shown;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The email row is delivered by the same relay; give it the same chance.
    let emails = loop {
        let emails = match &peers.mail_dir {
            Some(dir) => Some(count_eml(dir)?),
            None => None,
        };
        if emails.is_none_or(|n| n > 0) || Instant::now() > deadline {
            break emails;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    Ok((shown, emails))
}

/// The count `sql` (a `SELECT count(*)`) reads from the database at `database_url`, on a
/// connection of its own.
pub(crate) async fn count_in(database_url: &str, sql: &str) -> anyhow::Result<i64> {
    let pg = txoutbox::pg::PgConfig::parse(database_url)?;
    let (db, connection) = pg.connect().await?;
    tokio::spawn(txoutbox::pg::drive(connection));
    Ok(db.query_one(sql, &[]).await?.get(0))
}

/// "What exists now": the charges, PaymentIntents and emails, and the client's attempts.
async fn report(peers: &Peers, story: &Story) -> anyhow::Result<()> {
    let charges = count_in(
        &peers.database_url,
        "SELECT count(*) FROM charges WHERE customer_id = 'cus_demo'",
    )
    .await?;
    println!("\nWhat exists now:");
    println!("  charges:         {charges} ({})", story.charge_id);
    match &peers.fake {
        Some(fake) => println!(
            "  PaymentIntents:  {} (at the fake Stripe, Idempotency-Key {})",
            fake.intents().len(),
            fake.requests()
                .first()
                .and_then(|r| r.idempotency_key.clone())
                .unwrap_or_default()
        ),
        None => println!(
            "  PaymentIntents:  see your Stripe dashboard ({})",
            story.shown["stripe_id"]
        ),
    }
    match story.emails {
        Some(n) => println!("  emails:          {n}"),
        None => println!("  emails:          sent over SMTP_URL"),
    }
    println!(
        "  HTTP attempts:   {} (one key: {})",
        story.attempts, story.key
    );
    Ok(())
}

/// What the chain's next hop came to.
struct Hop {
    webhook_id: String,
    /// The relay's attempts of the webhook row, once delivered (`None`: not delivered in time).
    attempts: Option<i32>,
    shipments: i64,
    emails: Option<usize>,
}

/// Steps 7 and 8: the shipping service dies after its commit; restarted, it answers the relay's
/// redelivery (same `webhook-id`) as a duplicate.
async fn next_hop(
    peers: &Peers,
    shipping: &mut ShippingPeer,
    story: &Story,
    deadline: Instant,
) -> anyhow::Result<Hop> {
    let charge_id: uuid::Uuid = story.charge_id.parse()?;
    let webhook_id = crate::shipping_webhook_id(charge_id)?;
    println!(
        "7. The relay sends charge.succeeded to the shipping service (webhook-id {webhook_id})."
    );
    let remaining = deadline.saturating_duration_since(Instant::now());
    let status = shipping.wait_crash(remaining).await?;
    println!(
        "   The shipping service committed the shipment and died before answering ({status})."
    );
    println!("8. The shipping service restarts; the relay redelivers with the same webhook-id: a duplicate, answered 200.");
    shipping.start(false).await?;
    let pg = txoutbox::pg::PgConfig::parse(&peers.database_url)?;
    let (db, connection) = pg.connect().await?;
    tokio::spawn(txoutbox::pg::drive(connection));
    let delivered = txoutbox::admin::MessageFilter {
        status: Some(txoutbox::admin::MessageStatus::Delivered),
        destination: Some(crate::SHIPPING_DESTINATION.to_owned()),
        downstream_key: Some(webhook_id.clone()),
        ..Default::default()
    };
    let attempts = loop {
        let rows = txoutbox::admin::list_messages(&db, &delivered).await?;
        if let Some(row) = rows.first() {
            break Some(row.attempts);
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (shipments, emails) = shipping.wait_shipped(deadline).await?;
    Ok(Hop {
        webhook_id,
        attempts,
        shipments,
        emails,
    })
}

/// The next hop's lines of "What exists now".
fn report_hop(hop: &Hop) {
    match hop.attempts {
        Some(n) => println!(
            "  webhooks:        1 delivered after {n} attempts (one webhook-id: {})",
            hop.webhook_id
        ),
        None => println!("  webhooks:        not delivered yet ({})", hop.webhook_id),
    }
    println!(
        "  shipments:       {} (at the shipping service)",
        hop.shipments
    );
    match hop.emails {
        Some(n) => println!("  shipping emails: {n}"),
        None => println!("  shipping emails: sent over SMTP_URL"),
    }
}

/// `--keep`: says where everything is and waits for SIGINT or SIGTERM.
async fn keep_up(peers: &Peers, server: &ServiceProcess, dashboard: &str) -> anyhow::Result<()> {
    let shutdown = txoutbox::relay::Shutdown::on_signal()?;
    println!("\nStill up until Ctrl-C:");
    println!("  service:    {} (POST /charge)", server.base_url());
    println!("  dashboard:  {dashboard}");
    match &peers.own_database {
        Some(url) => {
            println!("  Postgres:   DATABASE_URL={url}");
            println!("  try:        export DATABASE_URL={url}");
            println!("              txoutbox stats   (from this checkout: cargo run -p txoutbox-cli -- stats)");
            println!("              txoutbox list");
            println!("              txoutbox dashboard");
        }
        None => println!("  Postgres:   your DATABASE_URL (txoutbox stats, list, dashboard)"),
    }
    shutdown.wait().await;
    println!("stopping");
    Ok(())
}

pub(crate) fn count_eml(dir: &std::path::Path) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "eml"))
        .count())
}

/// A plain HTTP client for reads (rustls without a bundled provider needs ring installed).
pub fn reqwest_client() -> anyhow::Result<reqwest::Client> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?)
}
