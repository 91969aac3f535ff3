//! What the admin tests share: running the `txoutbox` binary against a test database.

use std::process::{Command, Output};

use txoutbox_test_support::TestDb;

/// Runs `txoutbox ARGS` against `db` (off the async workers, so relays keep running meanwhile).
pub async fn txoutbox(db: &TestDb, args: &[&str]) -> anyhow::Result<Output> {
    let url = db.url();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    Ok(tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_txoutbox"))
            .args(&args)
            .env("DATABASE_URL", url)
            .env_remove("RUST_LOG")
            .output()
    })
    .await??)
}

/// Runs a command that must succeed; returns its stdout.
pub async fn ok(db: &TestDb, args: &[&str]) -> anyhow::Result<String> {
    let out = txoutbox(db, args).await?;
    anyhow::ensure!(
        out.status.success(),
        "txoutbox {args:?} failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}
