//! One idempotent request, then the same request again: the second gets the first's answer.
//!
//! The request's business write (an order row), its response and its outbox row (an email)
//! commit in one transaction: `begin` claims the key, `enqueue` buffers the effect, `complete`
//! stores the response and writes the effect, `commit` makes all of it visible at once. The
//! retry with the same key is answered from the stored response and writes nothing.
//!
//! Run it with `cargo run -p txoutbox --example handler`: against `DATABASE_URL` when it is
//! set, otherwise against a throwaway Postgres started for the run (as `charge-service --demo`
//! does). It applies the migrations, and exits 0 when the retry was replayed.

use anyhow::{bail, Context};
use txoutbox::{Begin, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse};
use txoutbox_test_support::DemoDatabase;

/// The handler of `POST /orders`: what a web framework's handler would call.
async fn create_order(
    client: &mut tokio_postgres::Client,
    key: &IdempotencyKey,
    body: &[u8],
) -> anyhow::Result<StoredResponse> {
    let scope = Scope::new("orders")?;
    let fingerprint = Fingerprint::new("POST", "/orders", body);
    let tx = client.transaction().await?;
    match txoutbox::begin(&tx, &scope, key, &fingerprint).await? {
        Begin::New(mut claim) => {
            let row = tx
                .query_one(
                    "INSERT INTO orders (item) VALUES ($1) RETURNING id",
                    &[&"book"],
                )
                .await?;
            let id: i64 = row.get(0);
            let email = serde_json::json!({"to": "buyer@example.com", "order": id});
            claim.enqueue("confirmation", OutboxMessage::new("email", &email)?)?;
            let body = format!("{{\"order\":{id}}}").into_bytes();
            let response = StoredResponse {
                status: 201,
                headers: vec![],
                body,
            };
            claim.complete(&tx, &response).await?;
            tx.commit().await?;
            println!(
                "new request:   201 {}",
                String::from_utf8_lossy(&response.body)
            );
            Ok(response)
        }
        Begin::Replay(stored) => {
            println!(
                "same key:      {} {} (replayed)",
                stored.status,
                String::from_utf8_lossy(&stored.body)
            );
            Ok(stored)
        }
        Begin::Mismatch => bail!("the key was used for another request (422)"),
        Begin::InFlight => bail!("a request with this key is in flight (409)"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let database = DemoDatabase::from_env()?;
    let (_, mut client) = database.connect().await?;
    txoutbox::migrate(&mut client).await?;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text)")
        .await?;

    // The client's Idempotency-Key header: a new one per run, so a rerun starts afresh.
    let key = IdempotencyKey::from_header(&uuid::Uuid::new_v4().to_string())?;
    let before = counts(&client).await?;
    let first = create_order(&mut client, &key, b"{\"item\":\"book\"}").await?;
    let again = create_order(&mut client, &key, b"{\"item\":\"book\"}").await?;
    if again != first {
        bail!("the retry was answered {again:?}, not the stored {first:?}");
    }
    let after = counts(&client).await?;
    let (orders, emails) = (after.0 - before.0, after.1 - before.1);
    println!("two requests wrote {orders} order and {emails} email for a relay to send");
    (orders == 1 && emails == 1)
        .then_some(())
        .context("one order and one email expected")
}

/// Orders, and outbox rows waiting for a relay.
async fn counts(client: &tokio_postgres::Client) -> anyhow::Result<(i64, u64)> {
    let orders: i64 = client
        .query_one("SELECT count(*) FROM orders", &[])
        .await?
        .get(0);
    Ok((orders, txoutbox::admin::stats(client).await?.total.pending))
}
