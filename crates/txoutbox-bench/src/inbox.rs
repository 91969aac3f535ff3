//! The inbox benchmark: messages/s of a receiving handler (one business row and one onward
//! outbox row per message, its key given) alone, and of the same handler behind
//! `inbox::receive` (the record, and the onward key derived from the message id), same database,
//! same run; the ratio and the cost per message.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use txoutbox::inbox::{self, Consumer, Receive};
use txoutbox::OutboxMessage;
use txoutbox_test_support::TestDb;

use crate::ratio::Ratio;

/// Options of `txoutbox-bench inbox`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Clients (each one connection in a loop).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds each mode runs.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

/// The two handlers measured.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// BEGIN; INSERT the business row; INSERT the onward outbox row (its key given); COMMIT.
    HandlerAlone,
    /// BEGIN; `inbox::receive`; the same two rows (the onward key derived); COMMIT.
    WithInbox,
}

pub async fn run(db: &TestDb, args: &Args) -> Result<()> {
    let setup = db.connect().await?;
    setup
        .batch_execute(
            "CREATE TABLE bench_shipments (id bigserial PRIMARY KEY, message_id text NOT NULL, \
             created_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
    let pool = db.pool(args.clients + 1)?;
    println!(
        "txoutbox-bench inbox: {} clients, {}s per mode, same database, same run",
        args.clients, args.seconds
    );
    println!(
        "{:<28} {:>10} {:>8} {:>14}",
        "mode", "msg/s", "ratio", "µs/msg/client"
    );
    let mut alone = None;
    let mut ratio = Ratio::of(0.0, None);
    let mut extra_us = None;
    for mode in [Mode::HandlerAlone, Mode::WithInbox] {
        setup
            .batch_execute(
                "TRUNCATE bench_shipments, txoutbox_messages, txoutbox_inbox; CHECKPOINT",
            )
            .await?;
        let rate = measure(&pool, mode, args.clients, args.seconds).await?;
        let per_message_us = 1e6 * args.clients as f64 / rate.max(f64::MIN_POSITIVE);
        let (name, r) = match mode {
            Mode::HandlerAlone => {
                alone = Some((rate, per_message_us));
                ("handler alone", Ratio::of(rate, Some(rate)))
            }
            Mode::WithInbox => {
                ratio = Ratio::of(rate, alone.map(|(r, _)| r));
                extra_us = alone.map(|(_, us)| per_message_us - us);
                ("handler + inbox::receive", ratio)
            }
        };
        println!("{name:<28} {rate:>10.0} {r:>8} {per_message_us:>14.0}");
    }
    let extra = extra_us.map_or("n/a".to_owned(), |us| format!("{us:+.0} µs"));
    println!(
        "ratio: {ratio} (handler + inbox / handler alone, {} clients; {extra} per message)  \
         $ cargo run --release -p txoutbox-bench -- inbox --clients {} --seconds {}",
        args.clients, args.clients, args.seconds
    );
    Ok(())
}

async fn measure(
    pool: &deadpool_postgres::Pool,
    mode: Mode,
    clients: usize,
    seconds: u64,
) -> Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client_no in 0..clients {
        let (pool, stop, counting, done) =
            (pool.clone(), stop.clone(), counting.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.get().await?;
            let consumer = Consumer::new("bench")?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let id = format!("msg-{client_no}-{n}");
                one_message(&mut conn, &consumer, mode, &id).await?;
                if counting.load(Ordering::Relaxed) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // warm-up
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    counting.store(false, Ordering::Relaxed);
    let rate = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    Ok(rate)
}

async fn one_message(
    conn: &mut deadpool_postgres::Object,
    consumer: &Consumer,
    mode: Mode,
    id: &str,
) -> Result<()> {
    let tx = conn.transaction().await?;
    let email = OutboxMessage::new("email", &serde_json::json!({"shipment": id}))?;
    let insert = "INSERT INTO bench_shipments (message_id) VALUES ($1)";
    match mode {
        Mode::HandlerAlone => {
            tx.execute(insert, &[&id]).await?;
            let key = inbox::derive_inbox_downstream_key(consumer.name(), id, "email");
            txoutbox::enqueue(&tx, &[email.with_downstream_key(key)]).await?;
        }
        Mode::WithInbox => {
            let Receive::New(mut claim) = inbox::receive(&tx, consumer, id).await? else {
                anyhow::bail!("message {id} was not new");
            };
            tx.execute(insert, &[&id]).await?;
            claim.enqueue("email", email)?;
            claim.complete(&tx).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}
