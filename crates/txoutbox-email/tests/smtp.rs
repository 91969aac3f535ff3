//! The email sink against a real SMTP server (aiosmtpd), a real Postgres and the real relay:
//! what arrives, what a crash redelivers, and how 4xx, 5xx and outages are handled.

mod common;

use std::time::Duration;

use common::{attempts, db_with_receipt, delivered_receipt, delivery, enqueue, receipt};
use txoutbox::admin::{AttemptOutcome, MessageStatus};
use txoutbox::relay::DestinationPolicy;
use txoutbox::sink::Sink;
use txoutbox_email::{Email, EmailError, EmailSink, SmtpConfig, DESTINATION};
use txoutbox_test_support::abort_after_a_call;
use txoutbox_test_support::relay::{assert_lease_must_hold_the_timeout, quick_retry, RunningRelay};
use txoutbox_test_support::smtp::{SmtpServer, SmtpServerOptions};
use txoutbox_test_support::{
    eventually_some, outcomes, status, test_db_with_client, wait_for_key, TestDb,
};

type TestResult = anyhow::Result<()>;

/// A relay delivering `email` rows to `server` under `policy`, started.
fn smtp_relay(
    db: &TestDb,
    server: &SmtpServer,
    policy: DestinationPolicy,
) -> anyhow::Result<RunningRelay> {
    Ok(RunningRelay::start(
        db.relay()?
            .sink(DESTINATION, EmailSink::smtp(&server.url())?)
            .policy(DESTINATION, policy)
            .build()?,
    ))
}

/// The server accepted one mail, and it carries `message_id`.
fn one_mail_with_message_id(server: &SmtpServer, message_id: &str) -> TestResult {
    let mails = server.messages()?;
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].message_id(), Some(message_id));
    Ok(())
}

/// A server that refuses its next `n` mails with `reply`, the receipt `key` pending on a test
/// database (kept by the caller while the relay runs) and a relay delivering it (5 attempts at
/// the most), started.
async fn relay_to_a_server_refusing(
    n: usize,
    reply: &str,
    key: &str,
) -> anyhow::Result<(SmtpServer, TestDb, tokio_postgres::Client, RunningRelay)> {
    let server = SmtpServer::start().await?;
    server.fail_next(n, reply)?;
    let (db, client) = db_with_receipt(key).await?;
    let relay = smtp_relay(&db, &server, quick_retry(5))?;
    Ok((server, db, client, relay))
}

#[tokio::test]
async fn an_enqueued_email_arrives_with_its_fields_and_the_keys_message_id() -> TestResult {
    let server = SmtpServer::start().await?;
    let (db, mut client) = test_db_with_client().await?;
    let email = Email::new(
        "Shop <shop@example.com>",
        "ada@example.org",
        "Your receipt — #42",
    )
    .to("bob@example.org")
    .cc("Carol <carol@example.org>")
    .bcc("audit@example.com")
    .reply_to("Support <support@example.com>")
    .text("Thank you, Ada.")
    .html("<p>Thank you, <b>Ada</b>.</p>")
    .header("X-Order", "42");
    let key = uuid::Uuid::new_v4().to_string();
    enqueue(&mut client, &email, &key).await?;

    let relay = RunningRelay::start(
        db.relay()?
            .sink(DESTINATION, EmailSink::smtp(&server.url())?)
            .build()?,
    );
    let reply = delivered_receipt(&client, &key).await?;
    relay.stop().await?;

    let mails = server.messages()?;
    assert_eq!(mails.len(), 1, "one message arrived");
    let mail = &mails[0];
    assert_eq!(
        mail.message_id(),
        Some(format!("<{key}@example.com>").as_str())
    );
    assert_eq!(mail.header("Idempotency-Key"), Some(key.as_str()));
    assert_eq!(mail.header("From"), Some("Shop <shop@example.com>"));
    assert_eq!(mail.header("To"), Some("ada@example.org, bob@example.org"));
    assert_eq!(mail.header("Cc"), Some("Carol <carol@example.org>"));
    assert_eq!(
        mail.header("Reply-To"),
        Some("Support <support@example.com>")
    );
    assert_eq!(mail.header("Subject"), Some("Your receipt — #42"));
    assert_eq!(mail.header("X-Order"), Some("42"));
    assert_eq!(mail.header("Bcc"), None, "Bcc stays out of the headers");
    assert_eq!(mail.text.as_deref().map(str::trim), Some("Thank you, Ada."));
    assert_eq!(
        mail.html.as_deref().map(str::trim),
        Some("<p>Thank you, <b>Ada</b>.</p>")
    );
    assert_eq!(mail.mail_from.as_deref(), Some("shop@example.com"));
    let mut rcpt = mail.rcpt_tos.clone();
    rcpt.sort();
    assert_eq!(
        rcpt,
        [
            "ada@example.org",
            "audit@example.com",
            "bob@example.org",
            "carol@example.org"
        ]
    );
    let reply = reply.unwrap_or_default();
    assert!(
        reply.starts_with("250 ") && reply.contains("queued"),
        "the receipt is the server's reply: {reply:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_message_id_domain_can_be_configured() -> TestResult {
    let server = SmtpServer::start().await?;
    let (db, client) = db_with_receipt("order-7").await?;
    let sink = EmailSink::smtp(&server.url())?.with_message_id_domain("mail.shop.example")?;
    let relay = RunningRelay::start(db.relay()?.sink(DESTINATION, sink).build()?);
    delivered_receipt(&client, "order-7").await?;
    relay.stop().await?;
    one_mail_with_message_id(&server, "<order-7@mail.shop.example>")?;
    Ok(())
}

#[tokio::test]
async fn a_relay_crash_after_the_server_accepted_redelivers_with_the_same_message_id() -> TestResult
{
    let server = SmtpServer::start().await?;
    let (db, mut client) = test_db_with_client().await?;
    let key = uuid::Uuid::new_v4().to_string();
    enqueue(&mut client, &receipt(), &key).await?;

    let smtp = EmailSink::smtp(&server.url())?;
    abort_after_a_call(&db, DESTINATION, smtp, |relay| relay).await?;
    assert_eq!(
        server.messages()?.len(),
        1,
        "the server took the first copy"
    );
    let left = status(&client, &key).await?;
    assert!(
        matches!(left, Some(MessageStatus::Pending | MessageStatus::InFlight)),
        "the row is not completed: {left:?}"
    );

    let survivor = RunningRelay::start(
        db.relay()?
            .sink(DESTINATION, EmailSink::smtp(&server.url())?)
            .build()?,
    );
    delivered_receipt(&client, &key).await?;
    survivor.stop().await?;

    let mails = server.messages()?;
    assert_eq!(mails.len(), 2, "SMTP does not deduplicate: two copies");
    let expected = format!("<{key}@example.com>");
    assert_eq!(mails[0].message_id(), Some(expected.as_str()));
    assert_eq!(mails[1].message_id(), Some(expected.as_str()));
    assert_eq!(
        mails[0].raw, mails[1].raw,
        "the redelivery is the same message"
    );
    let outcomes: Vec<String> = attempts(&client, &key)
        .await?
        .into_iter()
        .map(|(_, o, _)| o)
        .collect();
    assert_eq!(outcomes, ["expired", "delivered"]);
    Ok(())
}

#[tokio::test]
async fn a_451_reply_is_retried_until_the_server_accepts() -> TestResult {
    let (server, _db, client, relay) =
        relay_to_a_server_refusing(2, "451 4.3.0 Mailbox busy, try again later", "busy-1").await?;
    delivered_receipt(&client, "busy-1").await?;
    relay.stop().await?;

    let log = attempts(&client, "busy-1").await?;
    let outcomes: Vec<&str> = log.iter().map(|(_, o, _)| o.as_str()).collect();
    assert_eq!(outcomes, ["retry", "retry", "delivered"], "{log:?}");
    for (_, _, error) in &log[..2] {
        let error = error.as_deref().unwrap_or_default();
        assert!(
            error.contains("451") && error.contains("Mailbox busy"),
            "{error}"
        );
    }
    assert_eq!(server.rejected()?.len(), 2);
    one_mail_with_message_id(&server, "<busy-1@example.com>")?;
    Ok(())
}

#[tokio::test]
async fn a_550_reply_dead_letters_the_row_at_once() -> TestResult {
    let (server, _db, client, relay) = relay_to_a_server_refusing(
        1,
        "550 5.1.1 <ada@example.org>: Recipient address rejected",
        "bounce-1",
    )
    .await?;
    let failed = wait_for_key(&client, "bounce-1", MessageStatus::Failed).await;
    relay.stop().await?;
    failed?;

    let row = client
        .query_one(
            "SELECT attempts, last_error FROM txoutbox_messages WHERE downstream_key = 'bounce-1'",
            &[],
        )
        .await?;
    let (tries, last_error): (i32, Option<String>) = (row.get(0), row.get(1));
    assert_eq!(tries, 1, "no retry");
    let last_error = last_error.unwrap_or_default();
    assert!(
        last_error.contains("550") && last_error.contains("Recipient address rejected"),
        "{last_error}"
    );
    assert!(server.messages()?.is_empty());
    assert_eq!(server.rejected()?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_server_that_is_down_is_retried_until_it_is_up() -> TestResult {
    let mut server = SmtpServer::start().await?;
    server.stop().await?;
    let (db, client) = db_with_receipt("outage-1").await?;
    let relay = smtp_relay(&db, &server, quick_retry(1000))?;
    eventually_some(
        "the relay keeps retrying while the server is down",
        || async {
            let log = outcomes(&client, "outage-1").await?;
            let retries = log.iter().filter(|o| **o == AttemptOutcome::Retry).count();
            Ok((retries >= 3).then_some(()))
        },
    )
    .await?;
    let log = attempts(&client, "outage-1").await?;
    let error = log[0].2.as_deref().unwrap_or_default();
    assert!(
        error.contains(&format!("127.0.0.1:{}", server.port())) && error.contains("refused"),
        "{error}"
    );
    assert!(server.messages()?.is_empty());

    server.restart().await?;
    delivered_receipt(&client, "outage-1").await?;
    relay.stop().await?;
    one_mail_with_message_id(&server, "<outage-1@example.com>")?;
    Ok(())
}

#[tokio::test]
async fn a_pooled_connection_to_a_restarted_server_is_replaced() -> TestResult {
    let mut server = SmtpServer::start().await?;
    let (db, mut client) = test_db_with_client().await?;
    let relay = smtp_relay(&db, &server, quick_retry(20))?;
    enqueue(&mut client, &receipt(), "before").await?;
    delivered_receipt(&client, "before").await?;
    server.restart().await?; // the pooled connection is now dead
    enqueue(&mut client, &receipt(), "after").await?;
    delivered_receipt(&client, "after").await?;
    relay.stop().await?;
    let ids: Vec<String> = server
        .messages()?
        .iter()
        .filter_map(|m| m.message_id().map(str::to_owned))
        .collect();
    assert_eq!(ids, ["<before@example.com>", "<after@example.com>"]);
    Ok(())
}

#[tokio::test]
async fn credentials_in_the_url_authenticate_and_a_refused_login_is_permanent() -> TestResult {
    let server = SmtpServer::start_with(SmtpServerOptions {
        auth: Some(("relay".to_owned(), "s3cr%t".to_owned())),
    })
    .await?;
    let (db, client) = db_with_receipt("authed").await?;
    let port = server.port();
    let good = EmailSink::smtp(&format!("smtp://relay:s3cr%25t@127.0.0.1:{port}"))?;
    let relay = RunningRelay::start(db.relay()?.sink(DESTINATION, good).build()?);
    delivered_receipt(&client, "authed").await?;
    relay.stop().await?;
    assert_eq!(server.messages()?.len(), 1);

    let bad = EmailSink::smtp(&format!("smtp://relay:wrong@127.0.0.1:{port}"))?;
    let delivery = delivery("unauthed")?;
    let err = bad
        .deliver(&delivery)
        .await
        .expect_err("a wrong password is refused");
    assert!(err.is_permanent(), "{err:?}");
    assert!(err.to_string().contains("535"), "{err}");
    assert!(
        !err.to_string().contains("wrong"),
        "no password in errors: {err}"
    );
    Ok(())
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_timeout_whose_outcome_is_unknown() -> TestResult {
    // Accepts the TCP connection and says nothing: no greeting, no reply.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = silent.local_addr()?.port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let sink = EmailSink::smtp_with(
        &format!("smtp://127.0.0.1:{port}"),
        SmtpConfig {
            timeout: Duration::from_millis(300),
            ..SmtpConfig::default()
        },
    )?;
    let delivery = delivery("silent")?;
    // A hang guard, not a bound on speed: the server holds the connection for ever, so only the
    // sink's own timeout can end the call.
    let err = tokio::time::timeout(Duration::from_secs(60), sink.deliver(&delivery))
        .await
        .map_err(|_| anyhow::anyhow!("the sink's timeout never ended the call"))?
        .expect_err("no answer");
    holder.abort();
    // The message may have been taken: retried with the same Message-ID by an at-least-once
    // destination, `unknown` for an at-most-once one, never dead-lettered.
    assert!(
        matches!(err, txoutbox::sink::DeliveryError::Indeterminate { .. }),
        "{err:?}"
    );
    // The configured timeout is what ended it, and the error says so.
    assert!(err.to_string().contains("no answer within 300ms"), "{err}");
    Ok(())
}

/// Sends one receipt through `sink` to `server`; returns the name the server saw in EHLO.
async fn ehlo_seen(server: &SmtpServer, sink: &EmailSink, key: &str) -> anyhow::Result<String> {
    sink.deliver(&delivery(key)?)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mails = server.messages()?;
    let mail = mails
        .iter()
        .find(|m| m.header("Idempotency-Key") == Some(key))
        .ok_or_else(|| anyhow::anyhow!("{key} did not arrive"))?;
    mail.ehlo
        .clone()
        .ok_or_else(|| anyhow::anyhow!("the server saw no EHLO"))
}

#[tokio::test]
async fn a_configured_hello_name_is_what_the_server_sees_in_ehlo() -> TestResult {
    let server = SmtpServer::start().await?;
    for (name, seen) in [
        ("relay1.shop.example", "relay1.shop.example"),
        ("[192.0.2.25]", "[192.0.2.25]"),
        ("2001:db8::25", "[IPv6:2001:db8::25]"),
    ] {
        let config = SmtpConfig {
            hello_name: Some(name.to_owned()),
            ..SmtpConfig::default()
        };
        let sink = EmailSink::smtp_with(&server.url(), config)?;
        assert_eq!(ehlo_seen(&server, &sink, name).await?, seen);
    }
    Ok(())
}

#[tokio::test]
async fn the_default_hello_name_is_fully_qualified_or_an_address_literal() -> TestResult {
    let server = SmtpServer::start().await?;
    let sink = EmailSink::smtp(&server.url())?;
    let ehlo = ehlo_seen(&server, &sink, "default-ehlo").await?;
    let host = hostname::get()?.to_string_lossy().into_owned();
    if host.contains('.') {
        assert_eq!(ehlo, host, "a host name with a dot is sent as it is");
    } else {
        assert_ne!(ehlo, host, "never the bare host name");
    }
    let literal = ehlo.starts_with('[') && ehlo.ends_with(']');
    assert!(
        literal || (ehlo.contains('.') && !ehlo.starts_with('.') && !ehlo.ends_with('.')),
        "{ehlo:?} is neither a fully qualified name nor an address literal"
    );
    if literal {
        assert_eq!(
            ehlo, "[127.0.0.1]",
            "the literal is the local address towards the server"
        );
    }
    assert!(
        format!("{sink:?}").contains(&ehlo),
        "the sink shows the name it uses: {sink:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_name_in_the_urls_path_is_the_ehlo_name_unless_hello_name_is_set() -> TestResult {
    let server = SmtpServer::start().await?;
    let url = format!("{}/from-url.shop.example", server.url());
    let sink = EmailSink::smtp(&url)?;
    assert_eq!(
        ehlo_seen(&server, &sink, "path").await?,
        "from-url.shop.example"
    );
    let config = SmtpConfig {
        hello_name: Some("configured.shop.example".to_owned()),
        ..SmtpConfig::default()
    };
    let sink = EmailSink::smtp_with(&url, config)?;
    assert_eq!(
        ehlo_seen(&server, &sink, "configured").await?,
        "configured.shop.example"
    );
    Ok(())
}

#[tokio::test]
async fn an_invalid_hello_name_is_refused_with_one_line_naming_the_setting() -> TestResult {
    for bad in [
        "relay 1.example",
        "relay1",
        "relay1.example\r\nRSET",
        "[not-an-ip]",
        "",
    ] {
        let config = SmtpConfig {
            hello_name: Some(bad.to_owned()),
            ..SmtpConfig::default()
        };
        let Err(EmailError::Config(line)) = EmailSink::smtp_with("smtp://127.0.0.1:2525", config)
        else {
            anyhow::bail!("{bad:?} was accepted as the EHLO name");
        };
        assert!(
            line.contains("hello_name") && !line.contains('\n') && !line.contains('\r'),
            "{bad:?}: {line}"
        );
    }
    let Err(EmailError::Config(line)) = EmailSink::smtp("smtp://127.0.0.1:2525/relay_1") else {
        anyhow::bail!("a URL path that is not a domain was accepted as the EHLO name");
    };
    assert!(
        line.contains("the SMTP URL's path") && line.contains("relay_1") && !line.contains('\n'),
        "{line}"
    );
    Ok(())
}

#[tokio::test]
async fn a_relay_whose_lease_cannot_hold_the_smtp_timeout_is_refused() -> TestResult {
    let sink = EmailSink::smtp("smtp://127.0.0.1:2525")?;
    assert_eq!(sink.timeout(), Some(Duration::from_secs(20)), "the default");
    let fitting = EmailSink::smtp_with(
        "smtp://127.0.0.1:2525",
        SmtpConfig {
            timeout: Duration::from_secs(5),
            ..SmtpConfig::default()
        },
    )?;
    assert_lease_must_hold_the_timeout(DESTINATION, "SMTP timeout", sink, fitting)?;
    Ok(())
}
