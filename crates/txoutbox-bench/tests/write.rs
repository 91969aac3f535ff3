//! `txoutbox-bench write` run as a user runs it, on the test server: a ratio whose baseline the
//! run did not measure (`--modes` left it out) is printed `n/a`, never `inf`.

use std::process::Command;

use txoutbox_test_support::test_db;

#[tokio::test]
async fn a_ratio_whose_baseline_was_not_measured_is_printed_n_a() -> anyhow::Result<()> {
    let db = test_db().await?;
    // The bench makes a database of its own on this server.
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
        .args(["--modes", "full-one-row"])
        .env("DATABASE_URL", db.url())
        .output()?;
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
        .args([
            "--modes",
            "business,full-one-row,sqlx-business,sqlx-full-one-row",
        ])
        .env("DATABASE_URL", db.url())
        .output()?;
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
