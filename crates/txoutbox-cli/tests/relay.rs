//! `txoutbox relay` as its own process: delivers, and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use txoutbox::{enqueue, OutboxMessage};
use txoutbox_test_support::process::one_error_line;
use txoutbox_test_support::process::terminate;
use txoutbox_test_support::select::value;
use txoutbox_test_support::smtp::SmtpServer;
use txoutbox_test_support::{counts, eventually_async, test_db, test_db_with_client, wait_until};

fn txoutbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_txoutbox"))
}

/// A receipt email to enqueue, under the downstream key `key`.
fn receipt(key: &str) -> anyhow::Result<OutboxMessage> {
    Ok(
        txoutbox_email::Email::new("shop@example.com", "buyer@example.com", "Receipt")
            .text("Thank you.")
            .into_outbox_message()?
            .with_downstream_key(key),
    )
}

#[tokio::test]
async fn the_relay_process_delivers_and_exits_0_on_sigterm_leaving_nothing_leased(
) -> anyhow::Result<()> {
    let (db, mut client) = test_db_with_client().await?;
    let mut relay = txoutbox()
        .args(["relay", "--stdout", "audit", "--poll-interval", "100ms"])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = relay.stdout.take().expect("piped");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let tx = client.transaction().await?;
    let messages = (0..3)
        .map(|i| {
            OutboxMessage::new("audit", &serde_json::json!({ "n": i }))
                .map(|m| m.with_downstream_key(format!("audit-{i}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    enqueue(&tx, &messages).await?;
    tx.commit().await?;
    let mut got = Vec::new();
    while got.len() < 3 {
        let line = lines.recv_timeout(Duration::from_secs(20))?;
        let value: serde_json::Value = serde_json::from_str(&line)?;
        got.push(
            value["downstream_key"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    got.sort();
    assert_eq!(got, ["audit-0", "audit-1", "audit-2"]);
    assert_eq!(terminate(&mut relay)?, Some(0));
    let after = counts(&client).await?;
    assert_eq!(after.hot(), 0, "nothing left leased, nothing left behind");
    assert_eq!(after.delivered, 3);
    Ok(())
}

#[tokio::test]
async fn a_relay_without_sinks_refuses_to_start() -> anyhow::Result<()> {
    let db = test_db().await?;
    let out = txoutbox()
        .arg("relay")
        .env("DATABASE_URL", db.url())
        .output()?;
    let err = one_error_line(&out);
    assert!(err.contains("no sink configured"), "{err}");
    Ok(())
}

#[test]
fn a_bad_duration_is_a_usage_error() {
    let out = txoutbox()
        .args(["relay", "--lease", "soon"])
        .env("DATABASE_URL", "postgres://x@127.0.0.1:1/x")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn the_relay_process_registers_the_built_in_sinks_from_its_configuration(
) -> anyhow::Result<()> {
    let (db, mut client) = test_db_with_client().await?;
    let stripe = txoutbox_test_support::fake_stripe::FakeStripe::start().await?;
    let mail_dir = tempfile::tempdir()?;
    let mut relay = txoutbox()
        .args(["relay", "--poll-interval", "100ms"])
        .env("DATABASE_URL", db.url())
        .env("MAIL_DIR", mail_dir.path())
        .env("STRIPE_SECRET_KEY", stripe.secret_key())
        .env("STRIPE_API_BASE", stripe.base_url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let tx = client.transaction().await?;
    let email = receipt("receipt-1")?;
    let intent = txoutbox_stripe::NewPaymentIntent::new(1500, "eur")
        .with_customer("cus_1")
        .with_payment_method("pm_card_visa")
        .into_outbox_message()?
        .with_downstream_key("charge-1");
    enqueue(&tx, &[email, intent]).await?;
    tx.commit().await?;
    let delivered = wait_until(&client, |c| c.delivered >= 2).await;
    let exit = terminate(&mut relay)?;
    assert_eq!(
        delivered?.delivered, 2,
        "the email and the payment intent were delivered"
    );
    assert_eq!(exit, Some(0));
    let emails: Vec<_> = std::fs::read_dir(mail_dir.path())?.collect();
    assert_eq!(emails.len(), 1);
    let eml = std::fs::read_to_string(
        emails[0]
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .path(),
    )?;
    assert!(eml.contains("Message-ID: <receipt-1@example.com>"), "{eml}");
    let intents = stripe.intents();
    assert_eq!(intents.len(), 1);
    let keys: Vec<Option<String>> = stripe
        .requests()
        .iter()
        .map(|r| r.idempotency_key.clone())
        .collect();
    assert_eq!(keys, [Some("charge-1".to_owned())]);
    Ok(())
}

#[tokio::test]
async fn the_relay_process_greets_the_smtp_server_with_its_helo_name() -> anyhow::Result<()> {
    let (db, mut client) = test_db_with_client().await?;
    let server = SmtpServer::start().await?;
    let mut relay = txoutbox()
        .args(["relay", "--poll-interval", "100ms"])
        .args(["--smtp-url", &server.url()])
        .env("DATABASE_URL", db.url())
        .env("SMTP_HELO_NAME", "relay7.shop.example")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let tx = client.transaction().await?;
    let email = receipt("receipt-ehlo")?;
    enqueue(&tx, &[email]).await?;
    tx.commit().await?;
    let mails = server.wait_for_messages(1, Duration::from_secs(20)).await;
    let exit = terminate(&mut relay)?;
    let mails = mails?;
    assert_eq!(mails.len(), 1, "the receipt arrived");
    assert_eq!(mails[0].ehlo.as_deref(), Some("relay7.shop.example"));
    assert_eq!(exit, Some(0));
    Ok(())
}

#[test]
fn a_helo_name_that_is_not_fully_qualified_is_refused_in_one_line() {
    let out = txoutbox()
        .args(["relay", "--smtp-url", "smtp://127.0.0.1:2525"])
        .args(["--smtp-helo-name", "relay7"])
        .env("DATABASE_URL", "postgres://x@127.0.0.1:1/x")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("error"))
        .unwrap_or_default();
    assert!(
        line.contains("SMTP_HELO_NAME")
            && line.contains("\"relay7\"")
            && line.contains("fully qualified"),
        "{err}"
    );
}

#[tokio::test]
async fn a_lease_too_short_for_the_sinks_is_refused_unless_their_timeout_is_lowered(
) -> anyhow::Result<()> {
    let db = test_db().await?;
    let args = [
        "relay",
        "--lease",
        "10s",
        "--smtp-url",
        "smtp://127.0.0.1:1",
        "--poll-interval",
        "100ms",
    ];
    let refused = txoutbox()
        .args(args)
        .env("DATABASE_URL", db.url())
        .output()?;
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("lease: 10s") && err.contains("\"email\"") && err.trim().lines().count() == 1,
        "{err}"
    );
    let mut relay = txoutbox()
        .args(args)
        .args(["--sink-timeout", "5s"])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .spawn()?;
    // A refused configuration ends the process before the relay records itself.
    let client = db.connect().await?;
    eventually_async("the relay recorded itself in txoutbox_relays", || async {
        value::<bool>(&client, "SELECT EXISTS (SELECT 1 FROM txoutbox_relays)").await
    })
    .await?;
    assert!(
        relay.try_wait()?.is_none(),
        "with --sink-timeout 5s the relay runs"
    );
    assert_eq!(terminate(&mut relay)?, Some(0));
    Ok(())
}
