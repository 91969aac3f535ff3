//! A batch job's effects, outside any HTTP request: `txoutbox::enqueue` with downstream keys of
//! the job's own, so running the job again does not enqueue twice what is still waiting.
//!
//! A nightly invoicing job writes one invoice email per customer in its own transaction. Each
//! message carries a downstream key made from what identifies the effect (the billing period and
//! the customer). A (destination, downstream key) still in the outbox is skipped, so a job that
//! crashed halfway and is run again enqueues only what is missing; a row already delivered is
//! written again, with the same key, which the relay forwards for the receiver to deduplicate.
//!
//! Run it with `cargo run -p txoutbox --example batch_enqueue`: against `DATABASE_URL` when it
//! is set, otherwise against a throwaway Postgres started for the run. Exits 0 when the second
//! run skipped everything the first wrote.

use anyhow::ensure;
use txoutbox::{Enqueued, OutboxMessage};
use txoutbox_test_support::DemoDatabase;

/// One run of the job: the period's invoice emails, in one transaction.
async fn invoice_job(
    client: &mut tokio_postgres::Client,
    period: &str,
    customers: &[&str],
) -> anyhow::Result<Enqueued> {
    let messages = customers
        .iter()
        .map(|customer| {
            let email =
                serde_json::json!({"to": format!("{customer}@example.com"), "period": period});
            Ok(OutboxMessage::new("email", &email)?
                .with_downstream_key(format!("invoice-{period}-{customer}"))
                // One customer's emails are delivered in the order they were enqueued.
                .with_ordering_key(format!("customer-{customer}")))
        })
        .collect::<txoutbox::Result<Vec<_>>>()?;
    let tx = client.transaction().await?;
    let enqueued = txoutbox::enqueue(&tx, &messages).await?;
    tx.commit().await?;
    Ok(enqueued)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let database = DemoDatabase::from_env()?;
    let (_, mut client) = database.connect().await?;
    txoutbox::migrate(&mut client).await?;

    // A period of its own per run, so a rerun against the same database starts afresh.
    let period = format!(
        "2026-12-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let first = invoice_job(&mut client, &period, &["ada", "grace"]).await?;
    println!(
        "first run:  {} written, {} skipped",
        first.written().len(),
        first.skipped().len()
    );
    ensure!(
        first.all_written(),
        "the first run should write every email"
    );

    // The job runs again (a retry after a crash), with one customer more.
    let again = invoice_job(&mut client, &period, &["ada", "grace", "linus"]).await?;
    println!(
        "second run: {} written, {} skipped (already enqueued)",
        again.written().len(),
        again.skipped().len()
    );
    ensure!(
        again.written().len() == 1 && again.skipped().len() == 2,
        "the second run should write only the new customer's email"
    );
    Ok(())
}
