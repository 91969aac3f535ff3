//! `GET /metrics` of the service binary: the write path's counters and the in-process relay's,
//! after one charge, its retry and the relay's deliveries.

use std::time::Duration;

use charge_service::reqwest_client;
use txoutbox_test_support::eventually_some;
use txoutbox_test_support::prometheus::sample;

mod common;

#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_a_charge_its_replay_and_its_deliveries() -> anyhow::Result<()> {
    let peers = common::Peers::start().await?;
    let server = common::start_service(&peers.env()).await?;
    let client = common::client(Duration::from_secs(30), Duration::from_secs(5))?;
    let operation = client.operation();
    let url = format!("{}/charge", server.base_url());
    let body = common::charge_body("cus_metrics");
    assert_eq!(operation.post_json(&url, &body).await?.status, 201);
    assert!(operation.post_json(&url, &body).await?.replayed());

    let metrics_url = format!("{}/metrics", server.base_url());
    let http = reqwest_client()?;
    let delivered = |scrape: &str, destination: &str| {
        sample(
            scrape,
            &format!(r#"txoutbox_messages_delivered_total{{destination="{destination}"}}"#),
        )
    };
    let scrape = eventually_some("both deliveries in /metrics", || async {
        let response = http.get(&metrics_url).send().await?;
        anyhow::ensure!(
            response.status() == 200,
            "GET /metrics: {}",
            response.status()
        );
        let scrape = response.text().await?;
        let both =
            delivered(&scrape, "stripe") == Some(1.0) && delivered(&scrape, "email") == Some(1.0);
        Ok(both.then_some(scrape))
    })
    .await?;
    for destination in ["stripe", "email"] {
        assert_eq!(delivered(&scrape, destination), Some(1.0), "{scrape}");
        assert_eq!(
            sample(
                &scrape,
                &format!(r#"txoutbox_messages_enqueued_total{{destination="{destination}"}}"#)
            ),
            Some(1.0),
            "one row per effect, the replay enqueued nothing: {scrape}"
        );
    }
    assert_eq!(
        sample(
            &scrape,
            r#"txoutbox_idempotency_replays_total{scope="charges"}"#
        ),
        Some(1.0),
        "{scrape}"
    );
    for series in [
        r#"txoutbox_idempotency_conflicts_total{scope="charges"}"#,
        r#"txoutbox_idempotency_replays_total{scope="reservations"}"#,
        r#"txoutbox_leases_reclaimed_total"#,
    ] {
        assert_eq!(
            sample(&scrape, series),
            Some(0.0),
            "{series} from start: {scrape}"
        );
    }
    assert!(
        scrape.contains("# TYPE txoutbox_delivery_latency_seconds histogram"),
        "{scrape}"
    );
    Ok(())
}
