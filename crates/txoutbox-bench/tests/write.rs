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
