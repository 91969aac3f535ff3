//! The operator dashboard mounted in the service binary under `/outbox`, behind the user
//! `DASHBOARD_USERS` names.

use std::time::Duration;

use charge_service::{reqwest_client, ServiceProcess};

mod common;

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_is_mounted_under_outbox_behind_its_operator_user() -> anyhow::Result<()> {
    let peers = common::Peers::start().await?;
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_charge-service"));
    let mut env = peers.env();
    env.push(("DASHBOARD_USERS".into(), "ops:s3cret:operator".into()));
    let server = ServiceProcess::start(exe, charge_service::free_addr()?, &env, &[]).await?;
    let client = common::client(Duration::from_secs(30), Duration::from_secs(5))?;
    let operation = client.operation();
    let url = format!("{}/charge", server.base_url());
    assert_eq!(
        operation
            .post_json(&url, &common::charge_body("cus_dash"))
            .await?
            .status,
        201
    );

    let http = reqwest_client()?;
    let dashboard = format!("{}/outbox", server.base_url());
    let anonymous = http.get(&dashboard).send().await?;
    assert_eq!(anonymous.status(), 401, "behind its user");
    let overview = http
        .get(&dashboard)
        .basic_auth("ops", Some("s3cret"))
        .send()
        .await?;
    assert_eq!(overview.status(), 200);
    assert!(overview.text().await?.contains("<h1>Overview</h1>"));
    // The request's effects are found from its Idempotency-Key; the customer's email is not shown.
    let key = http
        .get(format!(
            "{dashboard}/api/keys?scope=charges&key={}",
            operation.key()
        ))
        .basic_auth("ops", Some("s3cret"))
        .send()
        .await?
        .text()
        .await?;
    let found: serde_json::Value = serde_json::from_str(&key)?;
    let destinations: Vec<&str> = found["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["destination"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(destinations.len(), 2, "{key}");
    assert!(destinations.contains(&"stripe") && destinations.contains(&"email"));
    assert!(!key.contains("ada@example.org"), "{key}");
    Ok(())
}
