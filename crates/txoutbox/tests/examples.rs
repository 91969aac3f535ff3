//! The examples under `crates/txoutbox/examples/` run, each against a test database of its own,
//! and leave what they say they do.
//!
//! The test runs the binaries cargo has built beside the test binaries (`target/debug/examples/`):
//! `cargo nextest run` and `cargo test` build every example of the packages they test, so
//! `./scripts/test` (and CI) builds and runs them. Running this file alone
//! (`--test examples`) needs `cargo build -p txoutbox --examples` first; a binary older than its
//! source is refused rather than run.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{ensure, Context};
use txoutbox::admin::{stats, StatusCounts};
use txoutbox_test_support::{test_db, TestDb};

type TestResult = anyhow::Result<()>;

/// The example's binary, built by cargo next to this test's (`target/<profile>/examples/`).
fn example_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("the test binary is not in target/<profile>/deps")?;
    let binary = profile_dir.join("examples").join(name);
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.rs"));
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .with_context(|| {
            format!(
                "no {}: run `cargo build -p txoutbox --examples`",
                binary.display()
            )
        })?;
    ensure!(
        built >= std::fs::metadata(&source)?.modified()?,
        "{} is older than its source: run `cargo build -p txoutbox --examples`",
        binary.display()
    );
    Ok(binary)
}

/// Runs an example against `db`; its standard output, after checking it exited 0.
fn run_example(name: &str, db: &TestDb) -> anyhow::Result<String> {
    let output = Command::new(example_binary(name)?)
        .env("DATABASE_URL", db.url())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "{name} exited with {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

/// The outbox's rows of `destination` by state.
async fn counts(db: &TestDb, destination: &str) -> anyhow::Result<StatusCounts> {
    let stats = stats(&db.connect().await?).await?;
    let found = stats
        .destinations
        .iter()
        .find(|d| d.destination == destination);
    Ok(found.map(|d| d.counts).unwrap_or_default())
}

#[tokio::test]
async fn handler_example_replays_the_retry_and_enqueues_one_email() -> TestResult {
    let db = test_db().await?;
    let stdout = run_example("handler", &db)?;
    assert!(stdout.contains("(replayed)"), "{stdout}");
    let email = counts(&db, "email").await?;
    assert_eq!((email.pending, email.delivered), (1, 0), "{email:?}");
    Ok(())
}

#[tokio::test]
async fn custom_sink_example_delivers_every_row_through_its_sink() -> TestResult {
    let db = test_db().await?;
    let stdout = run_example("custom_sink", &db)?;
    assert_eq!(stdout.matches("deliver ").count(), 3, "{stdout}");
    let console = counts(&db, "console").await?;
    assert_eq!(
        (console.pending, console.in_flight, console.delivered),
        (0, 0, 3),
        "{console:?}"
    );
    Ok(())
}

#[tokio::test]
async fn batch_enqueue_example_skips_what_the_first_run_enqueued() -> TestResult {
    let db = test_db().await?;
    let stdout = run_example("batch_enqueue", &db)?;
    assert!(
        stdout.contains("second run: 1 written, 2 skipped"),
        "{stdout}"
    );
    let email = counts(&db, "email").await?;
    assert_eq!(email.pending, 3, "{email:?}");
    Ok(())
}
