//! `txoutbox-bench write` run as a user runs it, on the test server: a ratio whose baseline the
//! run did not measure (`--modes` left it out) is printed `n/a`, never `inf`; rounds alternate the
//! modes and report the median round.

use std::process::Command;

use txoutbox_test_support::test_db;

#[tokio::test]
async fn a_ratio_whose_baseline_was_not_measured_is_printed_n_a() -> anyhow::Result<()> {
    let db = test_db().await?;
    // The bench makes a database of its own on this server.
    let printed = write(&db, &["--modes", "full-one-row"]).await?;
    let row = printed
        .lines()
        .find(|l| l.contains("deferred effects (1 row)"))
        .ok_or_else(|| anyhow::anyhow!("no full-one-row row: {printed}"))?;
    assert_eq!(row.matches("n/a").count(), 2, "ratio and vs hand: {row}");
    let ratio = printed
        .lines()
        .find(|l| l.starts_with("ratio: "))
        .ok_or_else(|| anyhow::anyhow!("no ratio line: {printed}"))?;
    assert!(ratio.starts_with("ratio: n/a "), "{ratio}");
    assert!(
        !printed
            .split_whitespace()
            .any(|word| matches!(word, "inf" | "-inf" | "NaN")),
        "{printed}"
    );
    Ok(())
}

#[tokio::test]
async fn the_sqlx_lines_are_measured_beside_the_tokio_postgres_ones() -> anyhow::Result<()> {
    let db = test_db().await?;
    let printed = write(
        &db,
        &[
            "--modes",
            "business,full-one-row,sqlx-business,sqlx-full-one-row",
        ],
    )
    .await?;
    for mode in ["sqlx: business insert only", "sqlx: ... + deferred effects"] {
        let row = printed
            .lines()
            .find(|l| l.contains(mode))
            .ok_or_else(|| anyhow::anyhow!("no {mode:?} row: {printed}"))?;
        // The column after the mode's name: transactions per second.
        let tps: f64 = row
            .split(mode)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|word| word.parse().ok())
            .unwrap_or(0.0);
        assert!(tps > 0.0, "{row}");
    }
    let ratio = printed
        .lines()
        .find(|l| l.starts_with("ratio sqlx / tokio-postgres: "))
        .ok_or_else(|| anyhow::anyhow!("no sqlx ratio line: {printed}"))?;
    assert!(ratio.contains("business insert only "), "{ratio}");
    assert!(!ratio.contains("n/a"), "{ratio}");
    Ok(())
}

#[tokio::test]
async fn rounds_alternate_the_modes_and_the_ratio_is_the_median_rounds() -> anyhow::Result<()> {
    let db = test_db().await?;
    let printed = write(
        &db,
        &[
            "--rounds",
            "3",
            "--modes",
            "business,full-one-row,full-one-row-after-begin",
        ],
    )
    .await?;
    // Each round measures every mode, in order: business, one row, one row after begin (the
    // table's rows open with the client count).
    let order: Vec<&str> = printed
        .lines()
        .filter(|l| l.trim_start().starts_with("1  "))
        .filter_map(|l| {
            [
                "business insert only",
                "deferred effects (1 row)",
                "insert after begin (1 row)",
            ]
            .into_iter()
            .find(|mode| l.contains(mode))
        })
        .collect();
    let round = [
        "business insert only",
        "deferred effects (1 row)",
        "insert after begin (1 row)",
    ];
    assert_eq!(order, round.repeat(3), "{printed}");
    let by_round = printed
        .lines()
        .find(|l| l.starts_with("ratio by round: "))
        .ok_or_else(|| anyhow::anyhow!("no ratio by round: {printed}"))?;
    assert_eq!(by_round.matches("(load ").count(), 3, "{by_round}");
    let median: &str = by_round
        .split("median ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or("");
    let ratio = printed
        .lines()
        .find(|l| l.starts_with("ratio: "))
        .ok_or_else(|| anyhow::anyhow!("no ratio line: {printed}"))?;
    assert!(
        ratio.starts_with(&format!("ratio: {median} ")),
        "the ratio line is the median round's ({median}): {ratio}"
    );
    assert!(ratio.contains("--rounds 3"), "{ratio}");
    let after_begin = printed
        .lines()
        .find(|l| l.starts_with("ratio with the insert after begin: "))
        .ok_or_else(|| anyhow::anyhow!("no after-begin ratio: {printed}"))?;
    assert!(!after_begin.contains("n/a"), "{after_begin}");
    Ok(())
}

/// Runs `txoutbox-bench write` for one client, one second, ratios at 1 client, with `args`
/// after, on a database of its own on the test server; fails unless it succeeds. Its output.
async fn write(db: &txoutbox_test_support::TestDb, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_txoutbox-bench"))
        .args([
            "write",
            "--clients",
            "1",
            "--seconds",
            "1",
            "--ratio-at",
            "1",
        ])
        .args(args)
        .env("DATABASE_URL", db.url())
        .output()?;
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(printed)
}
