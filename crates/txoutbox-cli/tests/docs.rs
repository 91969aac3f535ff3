//! The documentation names only flags the `txoutbox` command has: every `txoutbox <command> …
//! --flag` in README.md and docs/*.md (in code blocks and inline code), and every flag in the
//! first column of a flag table (a table whose first header is `flag`, for the command named
//! last before it under its heading), is looked up in that command's `--help`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// The flags of the real binary, as its `--help` lists them.
struct Cli {
    /// Flags every command takes (the top-level options).
    global: BTreeSet<String>,
    /// Each command's own flags.
    commands: BTreeMap<String, BTreeSet<String>>,
}

impl Cli {
    fn from_help() -> Self {
        let top = help(&[]);
        let commands = section(&top, "Commands:")
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| *name != "help")
            .map(|name| (name.to_owned(), options(&help(&[name]))))
            .collect();
        Cli {
            global: options(&top),
            commands,
        }
    }

    fn has(&self, command: Option<&str>, flag: &str) -> bool {
        self.global.contains(flag)
            || command.is_some_and(|c| self.commands.get(c).is_some_and(|f| f.contains(flag)))
    }
}

/// `txoutbox <args> --help`.
fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_txoutbox"))
        .args(args)
        .arg("--help")
        .env_remove("DATABASE_URL")
        .output()
        .expect("txoutbox runs");
    assert!(out.status.success(), "txoutbox {args:?} --help failed");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The lines of a help section (`Options:`, `Commands:`), up to the next unindented line.
fn section<'a>(help: &'a str, title: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    help.lines()
        .skip_while(move |line| *line != title)
        .skip(1)
        .take_while(|line| line.is_empty() || line.starts_with(' '))
}

/// The long flags a help text's `Options:` lists. An option's line is indented by at most six
/// spaces (a long help's description lines by more), and its flags come before the first gap of
/// two spaces (the short help's description follows on the same line).
fn options(help: &str) -> BTreeSet<String> {
    section(help, "Options:")
        .filter(|line| line.len() - line.trim_start().len() <= 6)
        .filter_map(|line| line.trim_start().split("  ").next())
        .flat_map(|names| names.split([' ', ',']))
        .filter_map(flag)
        .collect()
}

/// The long flag a word names (`--lease`, `[--by`, `--retention=7d,`), if it names one.
fn flag(word: &str) -> Option<String> {
    let word = word.trim_start_matches(['[', '(', '`', '"', '\'']);
    let name = word.strip_prefix("--")?;
    let name: String = name
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    let name = name.trim_end_matches('-');
    (!name.is_empty()).then(|| format!("--{name}"))
}

/// What the documents name, checked against the binary.
#[derive(Default)]
struct Report {
    /// Flags looked up.
    checked: usize,
    /// Flag tables found.
    tables: usize,
    /// Every flag (or command) the binary lacks, with where the document names it.
    missing: Vec<String>,
}

/// Where a scan is in a document: its name, the line, and the command named last under the
/// current heading (the one a flag table is for).
struct Place<'a> {
    file: &'a str,
    line: usize,
    command: Option<String>,
}

impl Place<'_> {
    fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// Checks every `txoutbox <command> … --flag` of one shell line or inline code span. A
/// `txoutbox` that is an option's value (`cargo test -p txoutbox --lib`) names the crate.
fn check_shell(text: &str, place: &mut Place<'_>, cli: &Cli, report: &mut Report) {
    let mut words = text.split_whitespace().peekable();
    let mut previous = "";
    while let Some(word) = words.next() {
        let after_an_option = std::mem::replace(&mut previous, word).starts_with('-');
        if word != "txoutbox" || after_an_option {
            continue;
        }
        let command = match words.peek() {
            Some(next) if next.starts_with('-') => None,
            Some(next) => {
                let name = next.trim_end_matches([',', '.', ';', ':', ')', '`']);
                // `txoutbox <command>`, `txoutbox = { … }`: not an invocation.
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
                    continue;
                }
                if !cli.commands.contains_key(name) {
                    let at = place.at();
                    report
                        .missing
                        .push(format!("{at}: `txoutbox {name}`: no such command"));
                    continue;
                }
                place.command = Some(name.to_owned());
                Some(name.to_owned())
            }
            None => None,
        };
        while let Some(word) = words.next_if(|w| !ends_a_command(w)) {
            if let Some(flag) = flag(word) {
                check(cli, command.as_deref(), &flag, place, report);
            }
        }
    }
}

/// A shell word after which the words are no longer the command's arguments.
fn ends_a_command(word: &str) -> bool {
    word == "txoutbox"
        || ["|", "||", "&&", ";"].contains(&word)
        || word.starts_with('#')
        || word.starts_with('>')
}

fn check(cli: &Cli, command: Option<&str>, flag: &str, place: &Place<'_>, report: &mut Report) {
    report.checked += 1;
    if !cli.has(command, flag) {
        let command = command.map_or(String::new(), |c| format!(" {c}"));
        let at = place.at();
        report
            .missing
            .push(format!("{at}: `txoutbox{command}` has no {flag}"));
    }
}

/// The inline code spans of a paragraph.
fn code_spans(paragraph: &str) -> impl Iterator<Item = &str> {
    paragraph.split('`').skip(1).step_by(2)
}

/// Checks a table: a flag table's first column against its command, any other's code spans.
fn check_table(rows: &[&str], place: &mut Place<'_>, cli: &Cli, report: &mut Report) {
    let first_cell = |row: &str| {
        row.trim()
            .trim_start_matches('|')
            .split('|')
            .next()
            .map(str::to_owned)
    };
    let is_flag_table = first_cell(rows[0]).is_some_and(|c| c.trim().eq_ignore_ascii_case("flag"));
    if !is_flag_table {
        for row in rows {
            for span in code_spans(row) {
                check_shell(span, place, cli, report);
            }
        }
        return;
    }
    report.tables += 1;
    let Some(command) = place.command.clone() else {
        let at = place.at();
        report.missing.push(format!(
            "{at}: a flag table with no `txoutbox <command>` named before it under its heading"
        ));
        return;
    };
    let first_line = place.line;
    for (n, row) in rows.iter().enumerate().skip(2) {
        place.line = first_line + n;
        let cell = first_cell(row).unwrap_or_default();
        for flag in cell.split_whitespace().filter_map(flag) {
            check(cli, Some(&command), &flag, place, report);
        }
    }
}

/// Checks one Markdown document.
fn check_document(file: &str, text: &str, cli: &Cli, report: &mut Report) {
    let lines: Vec<&str> = text.lines().collect();
    let mut place = Place {
        file,
        line: 0,
        command: None,
    };
    let mut i = 0;
    while i < lines.len() {
        place.line = i + 1;
        let line = lines[i];
        if let Some(lang) = line.strip_prefix("```") {
            i = if is_shell(lang) {
                check_code_block(&lines, i + 1, &mut place, cli, report)
            } else {
                skip_code_block(&lines, i + 1)
            };
            continue;
        }
        if line.trim().is_empty() {
            i += 1;
            continue;
        }
        if line.starts_with('#') {
            place.command = None;
        }
        // A paragraph, a table or a heading: up to the next blank line or fence.
        let end = (i..lines.len())
            .find(|&j| lines[j].trim().is_empty() || lines[j].starts_with("```"))
            .unwrap_or(lines.len());
        if line.trim_start().starts_with('|') {
            check_table(&lines[i..end], &mut place, cli, report);
        } else {
            let paragraph = lines[i..end].join(" ");
            for span in code_spans(&paragraph) {
                check_shell(span, &mut place, cli, report);
            }
        }
        i = end;
    }
}

/// Whether a fenced block of this info string holds shell lines (none given counts as shell);
/// `text`, `rust`, `yaml` and the like are output or code, whose `txoutbox` is no invocation.
fn is_shell(lang: &str) -> bool {
    matches!(
        lang.trim(),
        "" | "sh" | "shell" | "bash" | "console" | "zsh"
    )
}

/// The line after the closing fence of a block opened before `start`.
fn skip_code_block(lines: &[&str], start: usize) -> usize {
    (start..lines.len())
        .find(|&j| lines[j].starts_with("```"))
        .map_or(lines.len(), |j| j + 1)
}

/// Checks the lines of a fenced code block from `start` (lines ending in `\` continue on the
/// next); returns the line after its closing fence.
fn check_code_block(
    lines: &[&str],
    start: usize,
    place: &mut Place<'_>,
    cli: &Cli,
    report: &mut Report,
) -> usize {
    let mut i = start;
    let mut command = String::new();
    while i < lines.len() && !lines[i].starts_with("```") {
        if command.is_empty() {
            place.line = i + 1;
        }
        let line = lines[i];
        match line.strip_suffix('\\') {
            Some(continued) => command.push_str(continued),
            None => {
                command.push_str(line);
                check_shell(&command, place, cli, report);
                command.clear();
            }
        }
        command.push(' ');
        if command.trim().is_empty() {
            command.clear();
        }
        i += 1;
    }
    i + 1
}

/// README.md and every docs/*.md, as (name, text).
fn documents() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("docs/ is readable").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a document is readable");
            let name = path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string();
            (name, text)
        })
        .collect()
}

#[test]
fn every_flag_the_docs_name_exists_in_its_command() {
    let cli = Cli::from_help();
    let mut report = Report::default();
    for (name, text) in documents() {
        check_document(&name, &text, &cli, &mut report);
    }
    assert!(
        report.missing.is_empty(),
        "the documentation names flags the txoutbox command does not have:\n{}",
        report.missing.join("\n")
    );
    assert!(
        report.checked > 0 && report.tables > 0,
        "no flag found in the documentation ({} flags, {} flag tables): is the scan broken?",
        report.checked,
        report.tables
    );
}

#[test]
fn a_flag_the_command_lacks_is_reported_wherever_a_document_names_it() {
    let cli = Cli::from_help();
    let planted = "\
## Relay

```sh
cargo nextest run -p txoutbox --lib
txoutbox relay --lease 10s \\
    --no-such-flag
```

| flag | env |
|---|---|
| `--lease` | `TXOUTBOX_LEASE` |
| `--missing-in-table DEST=N` | |

Prose with `txoutbox purge --retention 1d --nope` inline.

```text
the database schema is at version 0, this txoutbox needs 5 --not-a-flag
```
";
    let mut report = Report::default();
    check_document("planted.md", planted, &cli, &mut report);
    assert_eq!(
        report.missing,
        [
            "planted.md:5: `txoutbox relay` has no --no-such-flag",
            "planted.md:12: `txoutbox relay` has no --missing-in-table",
            "planted.md:14: `txoutbox purge` has no --nope",
        ]
    );
}
