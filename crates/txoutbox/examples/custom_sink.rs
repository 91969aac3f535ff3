//! A relay with a sink of one's own: it prints each message, and the relay stops once every
//! enqueued row has been delivered.
//!
//! A sink implements [`txoutbox::sink::Sink`]: `deliver` gets one row (its payload and the
//! downstream key to forward, the same on every attempt) and answers a receipt, or an error that
//! says whether to retry. The relay claims committed rows, calls the sink, and moves each
//! delivered row to the history; `run` returns once its shutdown future resolves and the
//! deliveries in flight are finished.
//!
//! Run it with `cargo run -p txoutbox --example custom_sink`: against `DATABASE_URL` when it is
//! set, otherwise against a throwaway Postgres started for the run. Exits 0 when all delivered.

use std::collections::HashSet;

use anyhow::{bail, Context};
use tokio::sync::mpsc;
use txoutbox::relay::{Relay, Shutdown};
use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};
use txoutbox::OutboxMessage;
use txoutbox_test_support::DemoDatabase;

/// Prints what it gets, and tells `main` which row it delivered.
struct PrintSink {
    delivered: mpsc::UnboundedSender<uuid::Uuid>,
}

#[async_trait::async_trait]
impl Sink for PrintSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        println!(
            "deliver {} (attempt {}, key {}): {}",
            delivery.id, delivery.attempt, delivery.downstream_key, delivery.payload
        );
        let _ = self.delivered.send(delivery.id);
        Ok(Receipt::new("printed"))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let database = DemoDatabase::from_env()?;
    let (pg, mut client) = database.connect().await?;
    txoutbox::migrate(&mut client).await?;

    // Three rows for the destination "console", committed by a job of ours.
    let run = uuid::Uuid::new_v4();
    let messages = (1..=3)
        .map(|n| {
            let message = OutboxMessage::new("console", &serde_json::json!({"line": n}))?;
            Ok(message.with_downstream_key(format!("example-{run}-{n}")))
        })
        .collect::<txoutbox::Result<Vec<_>>>()?;
    let tx = client.transaction().await?;
    txoutbox::enqueue(&tx, &messages).await?;
    tx.commit().await?;

    let (sent, mut delivered) = mpsc::unbounded_channel();
    let relay = Relay::builder(pg)
        .sink("console", PrintSink { delivered: sent })
        .build()?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn(relay.run(shutdown.wait()));

    // Wait for every row (a redelivery repeats an id), then stop the relay.
    let mut waiting: HashSet<_> = messages.iter().map(OutboxMessage::id).collect();
    while !waiting.is_empty() {
        let id = delivered.recv().await.context("the relay stopped early")?;
        waiting.remove(&id);
    }
    shutdown.trigger();
    let report = running.await??;
    println!("relay stopped: {} row(s) claimed", report.claimed);

    let stats = txoutbox::admin::stats(&client).await?;
    let console = stats
        .destinations
        .iter()
        .find(|d| d.destination == "console");
    let counts = console.map(|d| d.counts).unwrap_or_default();
    if counts.pending + counts.in_flight > 0 {
        bail!("rows left undelivered: {counts:?}");
    }
    println!("console: {} delivered, none waiting", counts.delivered);
    Ok(())
}
