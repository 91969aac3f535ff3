//! The registry against the files, each file's header against its statement, and every statement
//! prepared against the latest schema.

use std::collections::BTreeSet;
use std::path::Path;

use tokio_postgres::types::Type;

use super::{expand, statement, PARTS, STATEMENTS};

/// A statement's declared parameters: `(number, name, type)` from the `-- $N name: type` lines
/// of its `-- Parameters:` section (the end of its header).
fn declared(sql: &str) -> Vec<(usize, String, String)> {
    sql.lines()
        .take_while(|line| line.starts_with("--"))
        .skip_while(|line| !line.starts_with("-- Parameters"))
        .filter_map(|line| line.strip_prefix("-- $"))
        .filter_map(|rest| {
            let (number, rest) = rest.split_once(' ')?;
            let (name, ty) = rest.split_once(": ")?;
            Some((number.parse().ok()?, name.to_owned(), ty.trim().to_owned()))
        })
        .collect()
}

/// The statement without its comments and string literals: what Postgres reads as code.
fn code(sql: &str) -> String {
    let text: Vec<&str> = sql
        .lines()
        .map(|line| line.split_once("--").map_or(line, |(code, _)| code))
        .collect();
    text.join("\n")
        .split('\'')
        .step_by(2)
        .collect::<Vec<_>>()
        .join("''")
}

/// The parameter numbers the statement's code uses.
fn used(sql: &str) -> BTreeSet<usize> {
    let code = code(sql);
    let mut numbers = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse() {
            numbers.insert(n);
        }
    }
    numbers
}

/// The `<folder>/<file>` names of the `.sql` files under `dir`, and the `<folder>/parts/<file>`
/// names of the parts under its folders' `parts/`.
fn files(dir: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut parts = BTreeSet::new();
    let name = |path: &Path| {
        path.file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8")
            .to_owned()
    };
    for folder in std::fs::read_dir(dir).expect("store/sql is readable") {
        let folder = folder.expect("a folder entry").path();
        for file in std::fs::read_dir(&folder).expect("a table folder is readable") {
            let file = file.expect("a file entry").path();
            if file.is_dir() && name(&file) == "parts" {
                for part in std::fs::read_dir(&file).expect("parts/ is readable") {
                    let part = part.expect("a part entry").path();
                    parts.insert(format!("{}/parts/{}", name(&folder), name(&part)));
                }
            } else {
                names.insert(format!("{}/{}", name(&folder), name(&file)));
            }
        }
    }
    (names, parts)
}

/// The parts the file `sql` includes: the names of its `\i` lines.
fn included(sql: &str) -> Vec<&str> {
    sql.lines()
        .filter_map(|line| line.strip_prefix("\\i "))
        .map(str::trim)
        .collect()
}

/// Asserts the files on disk and the registry's entries (`count` of them) are the same names.
fn same_files(what: &str, on_disk: &BTreeSet<String>, listed: &BTreeSet<String>, count: usize) {
    let unlisted: Vec<_> = on_disk.difference(listed).collect();
    let missing: Vec<_> = listed.difference(on_disk).collect();
    assert!(
        unlisted.is_empty(),
        "{what} under store/sql/ not in store::statements: {unlisted:?}"
    );
    assert!(
        missing.is_empty(),
        "{what} in the registry without a file: {missing:?}"
    );
    assert_eq!(listed.len(), count, "{what}: one listed twice");
}

#[test]
fn every_sql_file_is_in_the_registry_and_every_entry_has_its_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/sql");
    let (on_disk, parts_on_disk) = files(&dir);
    let listed: BTreeSet<String> = STATEMENTS
        .iter()
        .map(|(name, _, _)| format!("{name}.sql"))
        .collect();
    same_files("statements", &on_disk, &listed, STATEMENTS.len());
    let parts: BTreeSet<String> = PARTS.iter().map(|(name, _)| (*name).to_owned()).collect();
    same_files("parts", &parts_on_disk, &parts, PARTS.len());
}

#[test]
fn every_part_is_included_and_opens_with_its_comment() {
    let files = STATEMENTS.iter().map(|(_, file, _)| *file);
    let includes: Vec<&str> = files
        .chain(PARTS.iter().map(|(_, part)| *part))
        .flat_map(included)
        .collect();
    for (name, part) in PARTS {
        assert!(includes.contains(name), "{name}: no statement includes it");
        assert!(
            part.lines()
                .next()
                .is_some_and(|l| l.starts_with("-- ") && l.len() > 3),
            "{name}: opens without a `--` line saying what it is"
        );
        assert!(
            !part.contains("-- Parameters"),
            "{name}: a part's parameters are its statements'"
        );
        assert!(
            !statement(part).is_empty(),
            "{name}: no text after its header"
        );
    }
}

/// What is wrong with the header of statement `name` (empty: nothing).
fn header_problems(name: &str, sql: &str, sent: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let header: Vec<&str> = sql.lines().take_while(|l| l.starts_with("--")).collect();
    if !header
        .first()
        .is_some_and(|l| l.len() > 3 && !l.contains("Parameters"))
    {
        problems.push(format!(
            "{name}: opens without a `--` line saying what it does"
        ));
    }
    if !header.iter().any(|l| l.starts_with("-- Parameters")) {
        problems.push(format!("{name}: no `-- Parameters:` section"));
    }
    let numbers: Vec<usize> = declared(sql).iter().map(|(n, _, _)| *n).collect();
    if numbers != (1..=numbers.len()).collect::<Vec<_>>() {
        problems.push(format!("{name}: parameters not numbered $1.. in order"));
    }
    let used = used(sent);
    let listed: BTreeSet<usize> = numbers.into_iter().collect();
    for n in used.difference(&listed) {
        problems.push(format!("{name}: uses ${n} without declaring it"));
    }
    // A declared but unused parameter is allowed only where the header says why.
    for n in listed.difference(&used) {
        if !header.iter().any(|l| l.contains("unread")) {
            problems.push(format!("{name}: declares ${n} but never uses it"));
        }
    }
    if sent.trim().is_empty() {
        problems.push(format!("{name}: no statement after its header"));
    }
    problems
}

#[test]
fn every_statement_opens_with_its_comment_and_declares_each_parameter_it_uses() {
    let problems: Vec<String> = STATEMENTS
        .iter()
        .flat_map(|(name, sql, sent)| header_problems(name, sql, sent.sql))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_header_that_misses_a_parameter_is_refused() {
    let sql = "-- Reads a row.\n--\n-- Parameters:\n-- $1 id: uuid\nSELECT $1, $2 -- not $3\n";
    assert_eq!(
        header_problems("t", sql, statement(sql)),
        ["t: uses $2 without declaring it"]
    );
}

#[test]
fn the_text_sent_is_the_statement_without_its_header() {
    assert_eq!(
        statement("-- What.\n--\n-- Parameters: none.\nSELECT 1\n"),
        "SELECT 1"
    );
    assert_eq!(statement("-- Only a header.\n"), "");
    for (name, file, sent) in STATEMENTS {
        let sent = sent.sql;
        assert!(!sent.starts_with("--"), "{name}: its header would be sent");
        if included(file).is_empty() {
            assert_eq!(sent, statement(file), "{name}: not the file's statement");
        }
        for line in sent.lines() {
            let line = line.trim_start();
            assert!(
                !line.starts_with("--") && !line.starts_with("\\i "),
                "{name}: a part's header or a `\\i` line would be sent: {line}"
            );
        }
    }
}

#[test]
fn a_part_stands_in_place_of_its_include_line_without_its_header() {
    let parts = [
        ("t/parts/a.sql", "-- A.\n    x,\n\\i t/parts/b.sql\n"),
        ("t/parts/b.sql", "-- B.\n--\n-- More on B.\n    y\n"),
    ];
    let file = "-- S.\n--\n-- Parameters: none.\nSELECT\n\\i t/parts/a.sql\nFROM t\n";
    let len = expand(file, &parts, &mut [], 0, 0);
    let mut text = vec![0; len];
    assert_eq!(expand(file, &parts, &mut text, 0, 0), len);
    assert_eq!(
        String::from_utf8(text).expect("utf-8"),
        "SELECT\n    x,\n    y\nFROM t\n"
    );
}

#[test]
#[should_panic(expected = "not in the registry")]
fn an_include_of_an_unknown_part_is_refused() {
    expand("SELECT\n\\i t/parts/none.sql\n", &[], &mut [], 0, 0);
}

/// The parts (`store/sql/*/parts/`) make these the same by construction; this checks the
/// statements sent, whatever includes them.
#[test]
fn parts_shared_by_several_statements_read_the_same_in_each() {
    let text = |name: &str| {
        STATEMENTS
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, _, sent)| sent.sql)
            .unwrap_or_else(|| panic!("{name} is not in the registry"))
    };
    let between = |sql: &'static str, from: &str, to: &str| -> &'static str {
        let start = sql.find(from).expect("the shared part's start");
        let end = start + sql[start..].find(to).expect("the shared part's end") + to.len();
        &sql[start..end]
    };
    // The normalised error text.
    let class = between(text("messages/failure_groups"), "left(\n", "300)");
    for (name, times) in [
        ("messages/list", 2),
        ("messages/discard_select", 1),
        ("messages/replay_select", 1),
    ] {
        assert_eq!(
            text(name).matches(class).count(),
            times,
            "{name}: another normalised error"
        );
    }
    // The claim's tail.
    let tail = between(
        text("messages/claim"),
        "blocked AS (",
        "m.attempt_started_at)",
    );
    assert!(
        text("messages/claim_unbounded").contains(tail),
        "the two claims' tails differ"
    );
    // The completion's checks, and the key row's effects.
    let complete = text("idempotency_keys/complete_insert");
    // The sent text is trimmed: the checks end it.
    let checks = between(complete, "    CASE WHEN pg_backend_pid()", "AS s");
    assert!(
        complete.ends_with(checks),
        "the checks do not end the statement"
    );
    let effects = between(
        text("idempotency_keys/complete_update"),
        "effects = CASE",
        "END",
    );
    for way in ["insert", "take_over", "update"] {
        for rows in ["", "_with_messages"] {
            let name = format!("idempotency_keys/complete_{way}{rows}");
            assert!(
                text(&name).contains(checks),
                "{name}: other completion checks"
            );
            if way != "insert" {
                assert!(text(&name).contains(effects), "{name}: other kept effects");
            }
        }
    }
}

#[test]
fn the_wake_statements_use_the_wake_channel() {
    let channel = crate::wake::WAKE_CHANNEL;
    assert!(super::session::NOTIFY
        .sql
        .contains(&format!("pg_notify('{channel}'")));
    assert!(super::session::LISTEN
        .sql
        .trim_end()
        .ends_with(&format!("LISTEN {channel}")));
}

/// The type named `name` (as a header writes it) on `client`'s server.
async fn type_named(client: &tokio_postgres::Client, name: &str) -> anyhow::Result<Type> {
    let oid: u32 = client
        .query_one("SELECT $1::text::regtype::oid", &[&name])
        .await?
        .get(0);
    Type::from_oid(oid).ok_or_else(|| anyhow::anyhow!("{name}: not a built-in type"))
}

#[tokio::test]
async fn every_statement_prepares_against_the_latest_schema() -> anyhow::Result<()> {
    let db = txoutbox_test_support::test_db().await?;
    let client = db.connect().await?;
    let mut failures = Vec::new();
    for (name, sql, statement) in STATEMENTS {
        let mut types = Vec::new();
        for (n, _, ty) in declared(sql) {
            match type_named(&client, &ty).await {
                Ok(t) => types.push(t),
                Err(e) => failures.push(format!("{name}: ${n}: {e}")),
            }
        }
        // The types the store binds are read from the header at compile time: they must be the
        // ones the server reads there.
        if statement.types != types.as_slice() {
            failures.push(format!(
                "{name}: binds {:?}, its header declares {types:?}",
                statement.types
            ));
        }
        if let Err(e) = client.prepare_typed(statement.sql, statement.types).await {
            let detail = e
                .as_db_error()
                .map_or(e.to_string(), |d| d.message().to_owned());
            failures.push(format!("{name}: {detail}"));
        }
    }
    assert!(
        failures.is_empty(),
        "statements that do not prepare against the latest schema:\n{}",
        failures.join("\n")
    );
    Ok(())
}
