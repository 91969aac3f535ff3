//! The completion hook finds its charge by a reference a replay cannot change, and a completion
//! that matches no charge is an error, not a silent success.

use charge_service::ChargeHook;
use serde_json::Value;
use txoutbox::{
    admin::{ReplayOptions, ReplaySelection},
    sink::{Completion, CompletionHook, Delivery, Receipt},
};
use txoutbox_test_support::eventually_some;

mod common;

/// The charge's (status, stripe_id), once `status` is `wanted` (at most 30 s).
async fn wait_for_status(
    pool: &deadpool_postgres::Pool,
    charge_id: uuid::Uuid,
    wanted: &str,
) -> anyhow::Result<(String, Option<String>)> {
    eventually_some(&format!("the charge {wanted}"), || async {
        let row = pool
            .get()
            .await?
            .query_one(
                "SELECT status, stripe_id FROM charges WHERE id = $1",
                &[&charge_id],
            )
            .await?;
        let status: String = row.get(0);
        Ok((status == wanted).then(|| (status, row.get(1))))
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_declined_charge_replayed_with_a_new_key_is_marked_succeeded() -> anyhow::Result<()> {
    let peers = common::Peers::start().await?;
    let server = common::start_service(&peers.env()).await?;
    // Stripe declines the first PaymentIntent (402, a permanent error): the row is dead-lettered.
    peers.stripe.fail_next(402, 1);
    let outcome = common::charge(&server, "cus_declined").await?;
    let charge_id: uuid::Uuid = outcome.json::<Value>()?["charge_id"]
        .as_str()
        .unwrap_or_default()
        .parse()?;
    let pool = peers.db.pool(2)?;
    let (status, _) = wait_for_status(&pool, charge_id, "failed").await?;
    assert_eq!(status, "failed", "the declined charge is marked failed");

    // The operator replays it with a new key, as the README recommends for a cached decline.
    let message_id: uuid::Uuid = pool
        .get()
        .await?
        .query_one(
            "SELECT id FROM txoutbox_messages WHERE destination = 'stripe' AND status = 'failed'",
            &[],
        )
        .await?
        .get(0);
    let mut admin = peers.db.connect().await?;
    let report = txoutbox::admin::replay(
        &mut admin,
        &ReplaySelection::Ids(vec![message_id]),
        &ReplayOptions {
            new_key: true,
            ..ReplayOptions::default()
        },
        None,
    )
    .await?;
    assert_eq!(report.replayed.len(), 1, "{report:?}");

    let (status, stripe_id) = wait_for_status(&pool, charge_id, "succeeded").await?;
    assert_eq!(
        status, "succeeded",
        "the customer was charged: so is the charge"
    );
    let intents = peers.stripe.intents();
    assert_eq!(intents.len(), 1, "one PaymentIntent created: {intents:?}");
    assert_eq!(stripe_id.as_deref(), intents[0]["id"].as_str());
    drop(server);
    Ok(())
}

fn delivery_of(id: uuid::Uuid) -> Delivery {
    Delivery {
        id,
        destination: txoutbox_stripe::DESTINATION.to_owned(),
        payload: serde_json::json!({}),
        headers: Default::default(),
        downstream_key: "no-charge-has-this-key".to_owned(),
        ordering_key: None,
        attempt: 1,
        created_at: chrono::Utc::now(),
    }
}

#[tokio::test]
async fn the_hook_fails_when_no_charge_matches() -> anyhow::Result<()> {
    let (db, _server) = common::db_and_server().await?;
    let mut client = db.connect().await?;
    let tx = client.transaction().await?;
    let stranger = delivery_of(uuid::Uuid::now_v7());
    for completion in [
        Completion::Delivered(Receipt::new("pi_123")),
        Completion::DeadLettered("card_declined".to_owned()),
    ] {
        let err = ChargeHook::default()
            .completed(&tx, &stranger, &completion)
            .await
            .expect_err("a completion for no charge is an error");
        assert!(
            err.to_string().contains(&stranger.id.to_string()),
            "the error names the message: {err}"
        );
    }
    Ok(())
}

/// With the shipping chain on, a succeeded charge enqueues one `charge.succeeded` webhook whose
/// `webhook-id` derives from the charge id; a completion run again (a replayed PaymentIntent)
/// enqueues nothing more while the webhook is still in the outbox.
#[tokio::test]
async fn a_succeeded_charge_enqueues_one_shipping_webhook_keyed_by_the_charge() -> anyhow::Result<()>
{
    let (db, _server) = common::db_and_server().await?;
    let mut client = db.connect().await?;
    let (charge_id, message_id) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    client
        .execute(
            "INSERT INTO charges (id, customer_id, amount, currency, email, payment_key, \
             payment_message_id) VALUES ($1, 'cus_1', 1500, 'eur', 'ada@example.org', 'pk_1', $2)",
            &[&charge_id, &message_id],
        )
        .await?;
    let hook = ChargeHook::default().with_shipping();
    for _ in 0..2 {
        let tx = client.transaction().await?;
        hook.completed(
            &tx,
            &delivery_of(message_id),
            &Completion::Delivered(Receipt::new("pi_1")),
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        tx.commit().await?;
    }
    let rows = client
        .query(
            "SELECT downstream_key, payload FROM txoutbox_messages WHERE destination = $1",
            &[&charge_service::SHIPPING_DESTINATION],
        )
        .await?;
    assert_eq!(rows.len(), 1);
    let key: String = rows[0].get(0);
    assert_eq!(key, charge_service::shipping_webhook_id(charge_id)?);
    let payload: Value = rows[0].get(1);
    assert_eq!(payload["event_type"], "charge.succeeded");
    assert_eq!(payload["data"]["charge_id"], charge_id.to_string());
    assert_eq!(payload["data"]["email"], "ada@example.org");
    Ok(())
}
