//! The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, over the W3C
//! WebDriver protocol): the pages render (screenshots in `target/tmp/`), a click on "replay"
//! with a relay running delivers the row and the page shows it, an open page follows a row's
//! state by its live refresh, a discard asks for its reason and names the user, a destination
//! is paused from the overview (its open form outlasting a live refresh) and resumed, a viewer sees
//! no action and its forged POST is refused, a cross-site form is refused, a redacted field is
//! not in the page, a running relay is listed alive on the Relays page, an `unknown` row has its
//! own group on the Failures page.

use std::time::Duration;

use serde_json::json;
use txoutbox::admin::MessageStatus;
use txoutbox::sink::DeliveryError;
use txoutbox_dashboard::{DashboardConfig, User};
use txoutbox_test_support::factory::message;
use txoutbox_test_support::relay::{RecordingSink, RunningRelay, ScriptedSink};
use txoutbox_test_support::select::{column_with, value};
use txoutbox_test_support::serve_on_loopback;
use txoutbox_test_support::webdriver::Driver;
use txoutbox_test_support::{eventually_some, http_client, test_db_with_client, wait_until};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_in_a_browser_replays_a_failed_row_and_keeps_viewers_and_other_sites_out(
) -> anyhow::Result<()> {
    let (db, mut client) = test_db_with_client().await?;
    // Some history: delivered receipts, dead-lettered charges, a pending webhook.
    for i in 0..6 {
        message(&mut client)
            .destination("email")
            .payload(json!({"email": format!("customer{i}@example.com"), "template": "receipt"}))
            .create()
            .await?;
    }
    let relay = RunningRelay::start(db.relay()?.sink("email", RecordingSink::new()).build()?);
    wait_until(&client, |c| c.delivered == 6).await?;
    relay.stop().await?;
    let mut charges = Vec::new();
    for amount in [1200, 4500, 990, 300] {
        charges.push(
            message(&mut client)
                .destination("stripe")
                .payload(json!({"amount": amount, "currency": "eur"}))
                .create()
                .await?,
        );
    }
    let declining = ScriptedSink::new((0..4).map(|i| {
        Err(DeliveryError::permanent(format!(
            "402 card_declined for charge {i}"
        )))
    }));
    let relay = RunningRelay::start(db.relay()?.sink("stripe", declining).build()?);
    wait_until(&client, |c| c.failed == 4).await?;
    relay.stop().await?;
    message(&mut client)
        .destination("webhook:orders")
        .payload(json!({"order": 7}))
        .create()
        .await?;
    let email_row: Uuid = value(&client, "SELECT id FROM txoutbox_delivered LIMIT 1").await?;

    // The relay that delivers what gets replayed.
    let sink = RecordingSink::new();
    let relay = db.relay()?.sink("stripe", sink.clone()).build()?;
    let relay_owner = relay.owner().to_owned();
    let relay = RunningRelay::start(relay);

    let app = axum::Router::new().nest(
        "/outbox",
        txoutbox_dashboard::router(
            db.pool(4)?,
            DashboardConfig {
                users: vec![
                    User::parse("alice:op-secret:operator")?,
                    User::parse("victor:view-secret:viewer")?,
                ],
                redact: vec!["email".into()],
                ..DashboardConfig::default()
            },
        ),
    );
    let port = serve_on_loopback(app).await?.0.port();
    let plain = format!("http://127.0.0.1:{port}/outbox");
    let as_alice = format!("http://alice:op-secret@127.0.0.1:{port}/outbox");
    let as_victor = format!("http://victor:view-secret@127.0.0.1:{port}/outbox");

    let mut driver = Driver::start(env!("CARGO_TARGET_TMPDIR")).await?;
    let alice = driver.session(&["--window-size=1100,760"]).await?;

    // The pages render.
    alice.open(&as_alice).await?;
    assert_eq!(alice.text("h1").await?, "Overview");
    alice.expect_text("#backlog", "stripe").await?;
    alice.screenshot("dashboard-overview.png").await?;

    // Pause a destination from the overview: the opened "Pause…" outlasts a live refresh, the
    // row then says who paused it and why, and "Resume" ends the pause.
    let pause = "form[action$='/destinations/webhook:orders/pause']";
    alice
        .click(&format!("details.pause:has({pause}) summary"))
        .await?;
    alice.count_live_ticks().await?;
    eventually_some("a live-refresh tick with the form open", || async {
        Ok((alice.live_ticks().await? >= 1).then_some(()))
    })
    .await?;
    let open = alice
        .script(&format!(
            "return document.querySelector(\"{pause}\").closest('details').open;"
        ))
        .await?;
    assert_eq!(open, json!(true), "a live refresh closed the open form");
    alice
        .script(&format!(
            "document.querySelector(\"{pause} input[name=reason]\").value = \
             'partner migration'; return null;"
        ))
        .await?;
    alice.click(&format!("{pause} button")).await?;
    alice.wait_for_text("#backlog", "paused by alice").await?;
    alice.expect_text("#backlog", ": partner migration").await?;
    alice.screenshot("dashboard-paused.png").await?;
    alice
        .click("form[action$='/destinations/webhook:orders/resume'] button")
        .await?;
    eventually_some("webhook:orders resumed", || async {
        let flows = txoutbox::admin::destination_flows(&client).await?;
        let resumed = flows
            .iter()
            .any(|f| f.destination == "webhook:orders" && f.paused_at.is_none());
        Ok(resumed.then_some(()))
    })
    .await?;
    alice.open(&format!("{plain}/messages")).await?;
    alice
        .expect_text("table.messages", "402 card_declined")
        .await?;
    alice.screenshot("dashboard-messages.png").await?;
    // An at-most-once call whose outcome was lost: its own group, above the failed ones.
    // (Written in its end state: a pending row would be claimed by the relay running.)
    message(&mut client)
        .destination("sms")
        .payload(json!({"to": "+33600000000"}))
        .status(MessageStatus::Unknown)
        .attempts(1)
        .last_error("call timed out after sending")
        .create()
        .await?;
    alice.open(&format!("{plain}/failures")).await?;
    alice
        .expect_text("table.groups.failed", "402 card_declined for charge <n>")
        .await?;
    alice.expect_text("#unknown", "sms").await?;
    alice
        .expect_text("#unknown", "call timed out after sending")
        .await?;
    alice
        .expect_text("table.groups.unknown", "Replay this group")
        .await?;
    alice.screenshot("dashboard-failures.png").await?;

    // The relay delivering `stripe` shows on the Relays page, alive, with its sink.
    // And one killed an hour ago, whose row stayed behind: stale.
    client
        .batch_execute(
            "INSERT INTO txoutbox_relays (owner, host, pid, version, heartbeat_every, \
                 started_at, heartbeat_at, last_claim_at, held, sinks) \
             VALUES ('worker-7-4182-a1b2c3', 'worker-7', 4182, '0.1.0', interval '5 s', \
                 now() - interval '3 hours', now() - interval '1 hour', \
                 now() - interval '1 hour', 12, ARRAY['email', 'stripe'])",
        )
        .await?;
    alice.open(&format!("{plain}/relays")).await?;
    alice
        .wait_for_text("#relays", "1 relay alive, 1 stale")
        .await?;
    let relays = alice.text("table.relays").await?;
    assert!(
        relays.contains(relay_owner.as_str())
            && relays.contains("alive")
            && relays.contains("stripe"),
        "{relays}"
    );
    alice.screenshot("dashboard-relays.png").await?;

    // An open list shows the rows enqueued since, by its live refresh.
    alice
        .open(&format!("{plain}/messages?destination=late"))
        .await?;
    alice.expect_text("#results", "No message matches").await?;
    let late = message(&mut client)
        .destination("late")
        .payload(json!({}))
        .create()
        .await?;
    alice.wait_for_text("#results", &late.to_string()).await?;

    // A redacted field is not in the page.
    alice.open(&format!("{plain}/messages/{email_row}")).await?;
    let source = alice.source().await?;
    assert!(
        source.contains("[redacted]") && !source.contains("@example.com"),
        "{source}"
    );

    // Replay a failed row from its page: the relay delivers it and the page shows it.
    let charge = charges[0];
    alice.open(&format!("{plain}/messages/{charge}")).await?;
    alice.expect_text("#summary", "failed").await?;
    alice.screenshot("dashboard-message.png").await?;
    alice.click("form.actions button:not([name])").await?;
    assert_eq!(sink.wait_for(1, Duration::from_secs(20)).await, 1);
    alice.wait_for_text("#summary", "delivered").await?;
    alice.expect_text("#attempts", "by operator alice").await?;

    // A page left open follows the row: replayed by a script meanwhile, it shows the delivery
    // after its next live refresh, without a reload.
    let watched = charges[2];
    alice.open(&format!("{plain}/messages/{watched}")).await?;
    alice.expect_text("#summary", "failed").await?;
    let replayed = http_client()?
        .post(format!("{plain}/api/messages/{watched}/replay"))
        .basic_auth("alice", Some("op-secret"))
        .send()
        .await?;
    assert!(replayed.status().is_success());
    assert_eq!(sink.wait_for(2, Duration::from_secs(20)).await, 2);
    alice.wait_for_text("#summary", "delivered").await?;
    relay.stop().await?;

    // Discard a failed row from its page: without a reason the browser keeps the form; with one
    // the row is discarded and its history names the reason and the user.
    let dropped = charges[3];
    alice.open(&format!("{plain}/messages/{dropped}")).await?;
    alice.click("details.discard summary").await?;
    alice
        .script("window.__samePage = true; return null;")
        .await?;
    alice.click("details.discard button").await?;
    // The browser refuses the form (its reason is required): the click navigated nowhere.
    let kept = alice
        .script(
            "return document.querySelector('details.discard input[name=reason]').validity \
             .valueMissing && window.__samePage === true;",
        )
        .await?;
    assert_eq!(kept, json!(true), "the form without a reason was sent");
    alice.expect_text("#summary", "failed").await?;
    alice
        .script(
            "document.querySelector('details.discard input[name=reason]').value = \
             'refunded by hand'; return null;",
        )
        .await?;
    alice.click("details.discard button").await?;
    alice.wait_for_text("#summary", "discarded").await?;
    alice
        .expect_text("#attempts", "refunded by hand (by operator alice)")
        .await?;

    // A form on another site cannot act, even with the operator signed in.
    let other = charges[1];
    let forged = format!(
        "data:text/html,<form method=post action='{plain}/messages/{other}/replay'>\
         <button id=go>win a prize</button></form>"
    );
    alice.open(&forged).await?;
    alice.click("#go").await?;
    let refused = eventually_some("the forged form's answer", || async {
        let page = alice.source().await?;
        Ok(page.contains("cross-site request refused").then_some(page))
    })
    .await?;
    assert!(refused.contains("cross-site request refused"), "{refused}");

    // Every relay gone (the last one stopped, the other stale) while a row waits: the overview
    // raises the alarm. The week's charts have their axes too.
    message(&mut client)
        .destination("email")
        .payload(json!({"template": "receipt"}))
        .create()
        .await?;
    alice.open(&format!("{plain}?window=7d")).await?;
    alice.wait_for_text("#backlog", "No relay is alive").await?;
    alice.expect_text("#activity", "The last 7 d").await?;
    alice.screenshot("dashboard-no-relay-7d.png").await?;
    alice.close().await;

    // A viewer reads, sees no action, and a forged same-site POST is refused.
    let victor = driver.session(&["--window-size=1100,760"]).await?;
    victor
        .open(&format!("{as_victor}/messages/{other}"))
        .await?;
    victor.expect_text("#summary", "failed").await?;
    let forms = victor
        .script("return document.querySelectorAll('form[method=post], button').length")
        .await?;
    assert_eq!(forms, json!(0), "no action for a viewer");
    let status = victor
        .async_script(&format!(
            "const done = arguments[arguments.length - 1]; \
             fetch('{plain}/messages/{other}/replay', {{method: 'POST'}}).then(r => done(r.status));"
        ))
        .await?;
    assert_eq!(status, json!(403));
    victor.close().await;

    let states: Vec<String> = column_with(
        &client,
        "SELECT status FROM txoutbox_messages WHERE id = ANY($1)",
        &[&vec![charges[1]]],
    )
    .await?;
    assert_eq!(states, vec!["failed"], "refused actions changed nothing");
    Ok(())
}
