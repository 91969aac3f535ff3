//! The short soak of `./scripts/test`: three `txoutbox relay` processes, a private Postgres and
//! the scripted downstream under a fixed seed's faults, for well under three minutes. The long
//! run's command is in docs/benchmarks.md.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use txoutbox_bench::soak::{self, SoakOptions};

/// The seed of the short run (any seed must pass; this one is the one CI runs).
const SEED: u64 = 20261203;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_under_injected_faults_keep_every_delivery_invariant() -> anyhow::Result<()> {
    let mut options = SoakOptions::new(SEED, txoutbox_bin()?);
    options.rows = 200;
    options.chaos = Duration::from_secs(40);
    options.settle = Duration::from_secs(120);
    options.hostile = hostile_rows();
    let report = soak::run(&options).await?;
    print!("{}", report.table());
    for note in &report.notes {
        println!("note: {note}");
    }
    assert!(
        report.violations.is_empty(),
        "seed {SEED}: {} invariant violations (relay logs in {}):\n{}",
        report.violations.len(),
        report.log_dir.display(),
        report.violation_lines(10)
    );
    Ok(())
}

/// Whether the run stores undecodable rows: on unless `SOAK_HOSTILE_ROWS=0`. Each must fail
/// alone, its batch-mates delivered.
fn hostile_rows() -> bool {
    std::env::var("SOAK_HOSTILE_ROWS").map_or(true, |v| v != "0")
}

/// The `txoutbox` binary of this build: `TXOUTBOX_BIN`, else the one in this test's target
/// directory, built first when it is missing or older than the sources it is made of (a test
/// of this crate alone does not build another crate's binary).
fn txoutbox_bin() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("TXOUTBOX_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/soak-<hash> → target/<profile>/txoutbox
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| anyhow::anyhow!("no target directory above {}", exe.display()))?;
    let bin = profile_dir.join("txoutbox");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    let sources = newest(&root.join("crates"));
    if built.is_none() || sources.is_some_and(|s| Some(s) > built) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build
            .current_dir(&root)
            .args(["build", "-p", "txoutbox-cli", "--bin", "txoutbox"]);
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            build.arg("--release");
        }
        let status = build.status()?;
        anyhow::ensure!(status.success(), "cargo build -p txoutbox-cli failed");
    }
    Ok(bin)
}

/// The crates the `txoutbox` binary is made of.
const BINARY_CRATES: [&str; 7] = [
    "txoutbox",
    "txoutbox-cli",
    "txoutbox-webhook",
    "txoutbox-email",
    "txoutbox-stripe",
    "txoutbox-nats",
    "txoutbox-axum",
];

/// The newest modification time of the sources and manifests of [`BINARY_CRATES`] (their
/// `src/` and `Cargo.toml`).
fn newest(crates: &Path) -> Option<SystemTime> {
    fn walk(dir: &Path, newest: &mut Option<SystemTime>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                walk(&path, newest);
            } else if name.to_string_lossy().ends_with(".rs") || name == "Cargo.toml" {
                let modified = entry.metadata().and_then(|m| m.modified()).ok();
                if modified > *newest {
                    *newest = modified;
                }
            }
        }
    }
    let mut newest = None;
    for name in BINARY_CRATES {
        let dir = crates.join(name);
        let manifest = std::fs::metadata(dir.join("Cargo.toml")).and_then(|m| m.modified());
        newest = newest.max(manifest.ok());
        walk(&dir.join("src"), &mut newest);
    }
    newest
}
