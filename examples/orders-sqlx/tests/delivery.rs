//! The rest of the story: a relay delivers an order's receipt to a real SMTP server and its
//! webhook to a real HTTP receiver, once each, with the downstream keys stored on the rows.

use txoutbox::standard_webhooks::WebhookSecret;
use txoutbox_test_support::relay::RunningRelay;
use txoutbox_test_support::select::value_with;
use txoutbox_test_support::smtp::SmtpServer;
use txoutbox_test_support::wait_until;
use txoutbox_test_support::webhook::WebhookReceiver;

mod common;

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_delivers_an_orders_email_and_webhook_once_under_their_keys() -> anyhow::Result<()>
{
    let s = common::LocalService::start().await?;
    let smtp = SmtpServer::start().await?;
    let (receiver, addr) = WebhookReceiver::failing_first(&[]).await?;
    let key = common::key();
    // The order, and a retry of it: one set of effects.
    assert_eq!(s.orders.post(&key, &common::order()).await?.status(), 201);
    assert_eq!(s.orders.post(&key, &common::order()).await?.status(), 201);

    let secret = WebhookSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
    let relay = RunningRelay::start(
        s.db.relay()?
            .sink(
                txoutbox_email::DESTINATION,
                txoutbox_email::EmailSink::smtp(&smtp.url())?,
            )
            .sink(
                txoutbox_webhook::DESTINATION,
                txoutbox_webhook::WebhookSink::new(&format!("http://{addr}/orders"), secret)?,
            )
            .build()?,
    );
    wait_until(&s.client, |c| c.delivered == 2).await?;
    relay.stop().await?;

    let key_of = "SELECT downstream_key FROM txoutbox_delivered WHERE destination = $1";
    let mail = smtp.messages()?;
    assert_eq!(mail.len(), 1, "one receipt");
    assert_eq!(
        mail[0].header("Idempotency-Key"),
        Some(
            value_with::<String>(&s.client, key_of, &[&"email"])
                .await?
                .as_str()
        )
    );
    let calls = receiver.calls("orders");
    assert_eq!(calls.len(), 1, "one webhook call");
    assert_eq!(
        calls[0].webhook_id,
        value_with::<String>(&s.client, key_of, &[&"webhook"]).await?
    );
    Ok(())
}
