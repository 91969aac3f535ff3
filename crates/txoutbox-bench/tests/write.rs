//! `txoutbox-bench write` run as a user runs it, on the test server: a ratio whose baseline the
//! run did not measure (`--modes` left it out) is printed `n/a`, never `inf`; rounds alternate the
//! modes and report the median round.

use std::process::Command;

use txoutbox_test_support::test_db;

#[tokio::test]
async fn a_ratio_whose_baseline_was_not_measured_is_printed_n_a() -> anyhow::Result<()> {
    // The bench makes a database of its own on this server.
    let printed = write("full-one-row", &[]).await?;
    let row = printed
        .lines()
        .find(|l| l.contains("deferred effects (1 row)"))
        .ok_or_else(|| anyhow::anyhow!("no full-one-row row: {printed}"))?;
    assert_eq!(row.matches("n/a").count(), 2, "ratio and vs hand: {row}");
    let ratio = line_starting(&printed, "ratio: ")?;
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
    let modes = "business,full-one-row,sqlx-business,sqlx-full-one-row";
    let printed = write(modes, &[]).await?;
    for mode in ["sqlx: business insert only", "sqlx: ... + deferred effects"] {
        let row = line_with(&printed, mode)?;
        // The column after the mode's name: transactions per second.
        let tps: f64 = row
            .split(mode)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|word| word.parse().ok())
            .unwrap_or(0.0);
        assert!(tps > 0.0, "{row}");
    }
    let ratio = line_starting(&printed, "ratio sqlx / tokio-postgres: ")?;
    assert!(ratio.contains("business insert only "), "{ratio}");
    assert!(!ratio.contains("n/a"), "{ratio}");
    Ok(())
}

#[tokio::test]
async fn rounds_alternate_the_modes_and_the_ratio_is_the_median_rounds() -> anyhow::Result<()> {
    let modes = "business,full-one-row,full-one-row-after-begin";
    let printed = write(modes, &["--rounds", "3"]).await?;
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
    let by_round = line_starting(&printed, "ratio by round: ")?;
    assert_eq!(by_round.matches("(load ").count(), 3, "{by_round}");
    let median: &str = by_round
        .split("median ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or("");
    let ratio = line_starting(&printed, "ratio: ")?;
    assert!(
        ratio.starts_with(&format!("ratio: {median} ")),
        "the ratio line is the median round's ({median}): {ratio}"
    );
    assert!(ratio.contains("--rounds 3"), "{ratio}");
    let after_begin = line_starting(&printed, "ratio with the insert after begin: ")?;
    assert!(!after_begin.contains("n/a"), "{after_begin}");
    Ok(())
}

/// Runs `txoutbox-bench write --modes MODES` for one client, one second, ratios at 1 client,
/// with `args` after, on a database of its own on the test server; fails unless it succeeds.
/// Its output.
async fn write(modes: &str, args: &[&str]) -> anyhow::Result<String> {
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
        .args(["--modes", modes])
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

/// The line of `printed` that starts with `label`; fails naming the output when none does.
fn line_starting<'a>(printed: &'a str, label: &str) -> anyhow::Result<&'a str> {
    printed
        .lines()
        .find(|l| l.starts_with(label))
        .ok_or_else(|| anyhow::anyhow!("no {label:?} line: {printed}"))
}

/// The line of `printed` that contains `part`; fails naming the output when none does.
fn line_with<'a>(printed: &'a str, part: &str) -> anyhow::Result<&'a str> {
    printed
        .lines()
        .find(|l| l.contains(part))
        .ok_or_else(|| anyhow::anyhow!("no {part:?} row: {printed}"))
}
