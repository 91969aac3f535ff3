//! The build embeds the workspace's top-level `migrations/`, the one place the schema is written,
//! through the crate's `migrations` link (which `cargo package` turns into copies of the files).
//! A checkout that made the link a plain file (git with `core.symlinks` off) would embed nothing.

use std::path::Path;

#[test]
fn the_build_embeds_every_top_level_migration_unchanged() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut written = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(stem) = path.file_stem().and_then(|stem| stem.to_str()) else {
            continue;
        };
        if path.extension().and_then(|ext| ext.to_str()) != Some("sql") {
            continue;
        }
        let migration = refinery::Migration::unapplied(stem, &std::fs::read_to_string(&path)?)?;
        written.push((
            migration.version(),
            migration.name().to_owned(),
            migration.checksum(),
        ));
    }
    written.sort();

    assert!(!written.is_empty(), "migrations/ holds no migration");
    assert_eq!(txoutbox::admin::embedded_migrations(), written);
    Ok(())
}
