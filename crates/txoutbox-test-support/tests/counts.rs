//! The typed counts, the waits by meaning and the attempt-log assertions, against a real relay.

use std::time::Duration;

use txoutbox::admin::{AttemptOutcome, MessageStatus};
use txoutbox::sink::DeliveryError;
use txoutbox_test_support::factory::{message, pending_many};
use txoutbox_test_support::relay::{quick_retry, RunningRelay, ScriptedSink};
use txoutbox_test_support::{
    assert_outcomes, counts, counts_for, outcomes, status, test_db_with_client, wait_until,
    wait_until_within, Counts,
};

type TestResult = anyhow::Result<()>;

#[tokio::test]
async fn counts_tell_each_status_and_table_apart() -> TestResult {
    let (_db, mut client) = test_db_with_client().await?;
    pending_many(&mut client, "email", "p", 3).await?;
    for (key, status) in [
        ("f-1", MessageStatus::Failed),
        ("f-2", MessageStatus::Failed),
        ("u-1", MessageStatus::Unknown),
        ("i-1", MessageStatus::InFlight),
    ] {
        message(&mut client)
            .destination("webhook")
            .key(key)
            .status(status)
            .create()
            .await?;
    }
    let all = counts(&client).await?;
    assert_eq!(
        all,
        Counts {
            pending: 3,
            in_flight: 1,
            failed: 2,
            unknown: 1,
            ..Counts::default()
        }
    );
    assert_eq!(all.hot(), 7);
    assert_eq!(
        counts_for(&client, "email").await?,
        Counts {
            pending: 3,
            ..Counts::default()
        }
    );
    assert_eq!(status(&client, "f-2").await?, Some(MessageStatus::Failed));
    assert_eq!(status(&client, "nowhere").await?, None);
    Ok(())
}

#[tokio::test]
async fn a_wait_ends_when_the_state_is_reached_and_the_log_reads_in_order() -> TestResult {
    let (db, mut client) = test_db_with_client().await?;
    pending_many(&mut client, "email", "retry", 1).await?;
    let sink = ScriptedSink::new([Err(DeliveryError::retryable("connection reset"))]);
    let relay = RunningRelay::start(
        db.relay()?
            .sink("email", sink.clone())
            .policy("email", quick_retry(5))
            .build()?,
    );
    let reached = wait_until(&client, |c| c.delivered == 1).await?;
    relay.stop().await?;
    assert_eq!(reached.hot(), 0);
    assert_eq!(reached.attempts, 2);
    assert_eq!(
        status(&client, "retry-0").await?,
        Some(MessageStatus::Delivered)
    );
    assert_outcomes(
        &client,
        "retry-0",
        [AttemptOutcome::Retry, AttemptOutcome::Delivered],
    )
    .await?;
    let wrong = assert_outcomes(&client, "retry-0", [AttemptOutcome::Delivered]).await;
    let message = wrong
        .expect_err("a log of two outcomes is not one")
        .to_string();
    assert!(message.contains("[Retry, Delivered]"), "{message}");
    assert_eq!(outcomes(&client, "nowhere").await?, []);
    Ok(())
}

#[tokio::test]
async fn a_wait_never_reached_fails_naming_the_last_counts() -> TestResult {
    let (_db, mut client) = test_db_with_client().await?;
    pending_many(&mut client, "email", "k", 2).await?;
    let error = wait_until_within(&client, Duration::from_millis(200), |c| c.delivered == 2)
        .await
        .expect_err("no relay runs: nothing is delivered");
    let message = error.to_string();
    assert!(message.contains("pending: 2"), "{message}");
    Ok(())
}
