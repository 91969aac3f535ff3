use super::give_back::MAX_TEXT;
use super::*;

#[test]
fn storable_text_has_no_nul_and_a_bounded_length() {
    assert_eq!(storable("a\0b".into()), "a\u{FFFD}b");
    let long = "é".repeat(5000);
    let stored = storable(long);
    assert!(stored.len() < MAX_TEXT + 40, "{}", stored.len());
    assert!(stored.ends_with("(10000 bytes in all)"));
    assert_eq!(storable("fine".into()), "fine");
}

#[test]
fn the_call_limit_leaves_a_margin_for_the_completion() {
    let config = |lease| RelayConfig {
        lease,
        ..RelayConfig::default()
    };
    assert_eq!(
        config(Duration::from_secs(30)).call_limit(),
        Duration::from_secs(28)
    );
    assert_eq!(
        config(Duration::from_secs(1)).call_limit(),
        Duration::from_millis(800)
    );
}

#[test]
fn outcomes_are_stored_by_their_column_value() {
    let all = [
        Outcome::Delivered,
        Outcome::Retry,
        Outcome::Failed,
        Outcome::Unknown,
        Outcome::Released,
        Outcome::Unstarted,
    ];
    let names: Vec<_> = all.iter().map(|o| o.as_str()).collect();
    assert_eq!(
        names,
        [
            "delivered",
            "retry",
            "failed",
            "unknown",
            "released",
            "unstarted"
        ]
    );
}

/// `CLAIM_SESSION` as `SET` statements.
fn claim_session_settings() -> String {
    super::config::builder::CLAIM_SESSION
        .split("-c ")
        .filter(|s| !s.trim().is_empty())
        .map(|s| format!("SET {};", s.trim()))
        .collect()
}

#[tokio::test]
async fn the_lean_claim_reads_the_hot_table_through_its_indexes_whatever_its_statistics(
) -> anyhow::Result<()> {
    let db = txoutbox_test_support::test_db().await?;
    let client = db.connect().await?;
    // Statistics that say the table is empty: a plan built on them and kept is the danger.
    client.batch_execute("ANALYZE txoutbox_messages").await?;
    client.batch_execute(&claim_session_settings()).await?;
    let sent = crate::store::statements::messages::CLAIM_UNBOUNDED;
    client
        .batch_execute(&format!(
            "PREPARE claim(int8, text, float8, uuid[], float8, text[], int8[], float8) AS {sent}"
        ))
        .await?;
    let execute = "EXECUTE claim(500, 'relay', 30, '{}', 1, '{}', '{}', 1)";
    let plan: Vec<String> = client
        .query(&format!("EXPLAIN (COSTS OFF) {execute}"), &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(
        !plan.contains("Seq Scan on txoutbox_messages"),
        "the claim scans the hot table:\n{plan}"
    );
    assert!(
        plan.contains("Index Scan using txoutbox_messages_due"),
        "the claim does not read due rows in due order:\n{plan}"
    );
    // The plan kept is the generic one, and it claims what is due.
    client
        .batch_execute(
            "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key)
             SELECT gen_random_uuid(), 'log', '{}', g::text FROM generate_series(1, 700) g",
        )
        .await?;
    let claimed = client.query(execute, &[]).await?;
    assert_eq!(claimed.len(), 500);
    let (generic, custom): (i64, i64) = client
        .query_one(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'claim'",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))?;
    // Two uses (the EXPLAIN and the EXECUTE), both of the generic plan.
    assert_eq!((generic, custom), (2, 0));
    Ok(())
}

#[tokio::test]
async fn a_relay_claims_on_sessions_with_the_claim_settings() -> anyhow::Result<()> {
    let db = txoutbox_test_support::test_db().await?;
    let relay = Relay::builder(crate::pg::PgConfig::parse(&db.url())?).build()?;
    let claims = relay.inner.claim_pool.get().await?;
    let others = relay.inner.pool.get().await?;
    let show = |name: &'static str| {
        let (claims, others) = (&claims, &others);
        async move {
            let a: String = claims.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
            let b: String = others.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
            anyhow::Ok((a, b))
        }
    };
    assert_eq!(
        show("plan_cache_mode").await?,
        ("force_generic_plan".into(), "force_custom_plan".into())
    );
    assert_eq!(show("enable_seqscan").await?, ("off".into(), "on".into()));
    assert_eq!(show("enable_sort").await?, ("off".into(), "on".into()));
    assert_eq!(show("jit").await?, ("off".into(), "off".into()));
    Ok(())
}
