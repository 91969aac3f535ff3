//! The service's relay against an SMTP server slower than its lease: every call ends (times out)
//! before the lease does, so no second call of the receipt starts while the first still runs.

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use txoutbox::admin::AttemptOutcome;
use txoutbox_test_support::fake_stripe::FakeStripe;
use txoutbox_test_support::{eventually_some, logged, test_db};

mod common;

/// An SMTP server that never answers a message's DATA (slower than any lease).
async fn silent_smtp() -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("smtp://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let _ = write.write_all(b"220 slow.test ESMTP\r\n").await;
                let mut in_data = false;
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply: &[u8] = if in_data {
                        if line != "." {
                            continue;
                        }
                        // The connection stays open; the answer never comes.
                        std::future::pending().await
                    } else {
                        match line.get(..4).map(str::to_ascii_uppercase).as_deref() {
                            Some("EHLO") | Some("HELO") => b"250 slow.test\r\n",
                            Some("DATA") => {
                                in_data = true;
                                b"354 go ahead\r\n"
                            }
                            Some("QUIT") => {
                                let _ = write.write_all(b"221 bye\r\n").await;
                                return;
                            }
                            _ => b"250 ok\r\n",
                        }
                    };
                    if write.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok((url, task))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_receipt_call_never_outlives_the_relays_lease() -> anyhow::Result<()> {
    let db = test_db().await?;
    let stripe = FakeStripe::start().await?;
    // Slower than the lease (10 s), as the SMTP server that got five copies of one receipt.
    let (smtp_url, _smtp) = silent_smtp().await?;
    let env = vec![
        ("DATABASE_URL".to_owned(), db.url()),
        (
            "STRIPE_SECRET_KEY".to_owned(),
            stripe.secret_key().to_owned(),
        ),
        ("STRIPE_API_BASE".to_owned(), stripe.base_url()),
        ("SMTP_URL".to_owned(), smtp_url),
    ];
    let server = common::start_service(&env).await?;
    common::charge(&server, "cus_slow_mail").await?;

    // Wait for the receipt's first attempt to end (a timeout, or the late 250 at 12 s).
    let pool = db.pool(2)?;
    let first = eventually_some("the receipt's first attempt ended", || async {
        let row = pool
            .get()
            .await?
            .query_opt(
                "SELECT a.outcome, extract(epoch FROM a.finished_at - a.started_at)::float8 \
                 FROM txoutbox_attempts a JOIN txoutbox_messages m ON m.id = a.message_id \
                 WHERE m.destination = 'email' AND a.attempt = 1 \
                 ORDER BY a.finished_at LIMIT 1",
                &[],
            )
            .await?;
        Ok(row.map(|row| (row.get::<_, String>(0), row.get::<_, f64>(1))))
    })
    .await?;
    let (outcome, seconds) = first;
    assert_eq!(outcome, "retry", "the call timed out and is retried");
    assert!(
        seconds < charge_service::RELAY_LEASE.as_secs_f64(),
        "the call ended after {seconds} s, within the lease"
    );
    let conn = pool.get().await?;
    let overlapping = logged(&conn, AttemptOutcome::Expired).await?
        + logged(&conn, AttemptOutcome::LeaseLost).await?;
    assert_eq!(overlapping, 0, "no lease ran out under a call");
    drop(server);
    Ok(())
}
