//! Checks that `migrations/` holds the schema before `migrate.rs` embeds it, and rebuilds the crate
//! when a migration is added, changed or removed (the files the embedding macro includes tell
//! cargo of a change or a removal, not of an added file).
//!
//! In the repository `migrations` is a symbolic link to the top-level `migrations/`; a checkout
//! made without symbolic links (git's `core.symlinks` off) turns it into a small text file, from
//! which the macro would embed no migration at all. That fails here, with the fix.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    println!("cargo::rerun-if-changed=migrations");
    let dir = Path::new("migrations");
    let migrations = std::fs::read_dir(dir).map(|entries| {
        entries
            .filter_map(|entry| entry.ok())
            .filter(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                name.starts_with('V') && name.ends_with(".sql")
            })
            .count()
    });
    match migrations {
        Ok(count) if count > 0 => ExitCode::SUCCESS,
        _ => {
            eprintln!(
                "error: crates/txoutbox/migrations holds no V*.sql migration. It must be the \
                 symbolic link to the top-level migrations/ (check the work tree out with \
                 symbolic links: `git config core.symlinks true`, then \
                 `git checkout -- crates/txoutbox/migrations`)."
            );
            ExitCode::FAILURE
        }
    }
}
