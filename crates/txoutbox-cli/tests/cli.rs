//! The `txoutbox` binary, run as a user runs it.

use std::process::Command;

use txoutbox_test_support::process::{one_error_line, succeeded};
use txoutbox_test_support::select::value;
use txoutbox_test_support::{drop_schema, test_db_with_client};

fn txoutbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_txoutbox"))
}

#[tokio::test]
async fn migrate_applies_the_schema_and_twice_is_a_no_op() -> anyhow::Result<()> {
    let (db, client) = test_db_with_client().await?;
    drop_schema(&client).await?;
    let first = txoutbox()
        .arg("migrate")
        .env("DATABASE_URL", db.url())
        .output()?;
    let printed = succeeded(&first);
    let every: Vec<i32> = txoutbox::admin::embedded_migrations()
        .iter()
        .map(|(version, _, _)| *version)
        .collect();
    let said = format!("applied migrations {every:?}");
    assert!(printed.contains(&said), "{said}");
    let tables: i64 = value(
        &client,
        "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'txoutbox_%'",
    )
    .await?;
    assert_eq!(tables, 9);
    let second = txoutbox()
        .arg("migrate")
        .env("DATABASE_URL", db.url())
        .output()?;
    assert!(second.status.success());
    assert_eq!(
        String::from_utf8_lossy(&second.stdout).trim(),
        "schema up to date"
    );
    Ok(())
}

/// `txoutbox migrate`, configured by `configure`, failing as a runtime error: its one line.
fn migrate_error(configure: impl FnOnce(&mut Command)) -> String {
    let mut command = txoutbox();
    command.arg("migrate");
    configure(&mut command);
    one_error_line(&command.output().expect("runs"))
}

#[test]
fn missing_database_url_is_one_clear_line() {
    let err = migrate_error(|c| {
        c.env_remove("DATABASE_URL");
    });
    assert!(err.contains("DATABASE_URL"), "{err}");
}

#[test]
fn unreachable_database_is_one_clear_line() {
    let err = migrate_error(|c| {
        c.env(
            "DATABASE_URL",
            "postgres://nobody@127.0.0.1:1/none?connect_timeout=2",
        );
    });
    assert!(err.contains("cannot connect to the database"), "{err}");
}

#[test]
fn unknown_command_exits_2() {
    let out = txoutbox().arg("frobnicate").output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_help_summary_names_every_command() {
    let out = txoutbox().arg("--help").output().expect("runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let (summary, rest) = help.split_once("Usage:").expect("a usage line");
    let commands: Vec<&str> = rest
        .split_once("Commands:")
        .expect("a command list")
        .1
        .lines()
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert!(commands.len() >= 11, "{help}");
    for command in commands {
        assert!(
            summary.contains(command),
            "the summary does not name {command}: {summary}"
        );
    }
}

#[test]
fn a_url_with_an_unknown_scheme_says_so_and_not_the_password() {
    let out = txoutbox()
        .arg("stats")
        .env("DATABASE_URL", "postgress://app:s3cret@127.0.0.1:1/app")
        .output()
        .expect("runs");
    let err = one_error_line(&out);
    assert!(err.contains("unknown scheme `postgress`"), "{err}");
    assert!(
        err.contains("expected postgres:// or postgresql://"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
}

#[test]
fn a_connection_error_names_the_host_and_port_and_never_the_password() {
    let port = txoutbox_test_support::free_port().expect("a port");
    let out = txoutbox()
        .arg("stats")
        .env(
            "DATABASE_URL",
            format!("postgres://app:s3cret@127.0.0.1:{port}/app?connect_timeout=2"),
        )
        .output()
        .expect("runs");
    let err = one_error_line(&out);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}
