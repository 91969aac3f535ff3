//! `charge-service --demo --keep`, run as a new user runs it: after the story, the service, its
//! dashboard and the throwaway Postgres stay up until Ctrl-C, and the printed `DATABASE_URL`
//! reaches the demo's database (for `txoutbox stats`, `list`, `dashboard`). The story's count
//! includes the chain's next hop: the shipping service killed after its commit, the webhook
//! redelivered with the same `webhook-id`, one shipment and one shipping email.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use txoutbox_test_support::process::stdout_lines;
use txoutbox_test_support::select::value;

/// What the demo prints after a line starting with `prefix` (trimmed).
fn after(line: &str, prefix: &str) -> Option<String> {
    line.trim_start()
        .strip_prefix(prefix)
        .map(|rest| rest.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_with_keep_leaves_the_service_dashboard_and_postgres_up_until_ctrl_c(
) -> anyhow::Result<()> {
    let mut demo = Command::new(env!("CARGO_BIN_EXE_charge-service"))
        .args(["--demo", "--keep"])
        .env_remove("DATABASE_URL")
        .env_remove("STRIPE_SECRET_KEY")
        .env_remove("SMTP_URL")
        .env_remove("MAIL_DIR")
        .stdout(Stdio::piped())
        .spawn()?;
    let lines = stdout_lines(&mut demo)?;
    let (mut database_url, mut dashboard) = (None, None);
    let mut report = BTreeMap::new();
    let start = Instant::now();
    while database_url.is_none() {
        let line = lines.recv_timeout(Duration::from_secs(150).saturating_sub(start.elapsed()))?;
        dashboard = dashboard.or_else(|| after(&line, "dashboard:"));
        database_url = after(&line, "Postgres:   DATABASE_URL=");
        for name in [
            "charges:",
            "PaymentIntents:",
            "emails:",
            "webhooks:",
            "shipments:",
            "shipping emails:",
        ] {
            if let Some(value) = after(&line, name) {
                report.entry(name).or_insert(value);
            }
        }
    }
    let first_word = |name: &str| {
        report
            .get(name)
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(first_word("charges:"), "1", "{report:?}");
    assert_eq!(first_word("PaymentIntents:"), "1", "{report:?}");
    assert_eq!(first_word("emails:"), "1", "the receipt: {report:?}");
    assert_eq!(first_word("shipments:"), "1", "{report:?}");
    assert_eq!(first_word("shipping emails:"), "1", "{report:?}");
    // "1 delivered after N attempts (one webhook-id: …)": the kill after commit cost one.
    let webhooks = report.get("webhooks:").cloned().unwrap_or_default();
    let attempts: u32 = webhooks
        .split("after ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        webhooks.starts_with("1 delivered") && attempts >= 2,
        "{webhooks}"
    );
    let database_url = database_url.unwrap_or_default();
    let dashboard = dashboard.ok_or_else(|| anyhow::anyhow!("no dashboard line"))?;

    // The story is over, and its database is still there.
    let pg = txoutbox::pg::PgConfig::parse(&database_url)?;
    let (db, connection) = pg.connect().await?;
    tokio::spawn(txoutbox::pg::drive(connection));
    let charges: i64 = value(&db, "SELECT count(*) FROM charges").await?;
    assert_eq!(charges, 1);
    // So is the dashboard: "http://ADDR/outbox (user ops, password P)".
    let (url, credentials) = dashboard
        .split_once(" (user ops, password ")
        .ok_or_else(|| anyhow::anyhow!("dashboard line: {dashboard}"))?;
    let password = credentials.trim_end_matches(')');
    let page = charge_service::reqwest_client()?
        .get(url)
        .basic_auth("ops", Some(password))
        .send()
        .await?;
    assert_eq!(page.status(), 200);

    // Ctrl-C ends it all: the demo exits 0 and its Postgres is gone.
    let status = Command::new("kill")
        .args(["-INT", &demo.id().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -INT failed");
    let start = Instant::now();
    let exit = loop {
        if let Some(exit) = demo.try_wait()? {
            break exit;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = demo.kill();
            anyhow::bail!("the demo did not stop on SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit}");
    assert!(
        pg.connect().await.is_err(),
        "the demo's Postgres is stopped"
    );
    Ok(())
}
