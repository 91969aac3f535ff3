//! Every SQL statement of the core, one `.sql` file each under `store/sql/<table>/`, loaded with
//! `include_str!` and listed once in [`STATEMENTS`]. The functions of `store/` run them by the
//! constants below (`statements::messages::CLAIM`); nothing outside `store/` holds statement
//! text.
//!
//! A statement lives in the folder of the table it is mainly about (one that reads or writes
//! several says so in its comment); `session/` holds those about no table (advisory locks,
//! settings, the wake-up channel). Each file opens with `--` lines: what it does, why it is shaped
//! so, then `-- Parameters:` and one `-- $N name: type` line per parameter (`-- Parameters:
//! none.` when it takes none): the one place a parameter's type is written. Each constant is a
//! [`Statement`], the text sent (the header stays in the file) with those types, read at compile
//! time; the store binds its values with them, and the tests prepare it with them.
//!
//! A text several statements share is written once, as a part: a file under
//! `store/sql/<table>/parts/`, opening with `--` lines that say what it is and who includes it,
//! listed in the registry's `parts`. A statement includes it by a line `\i <table>/parts/<name>.sql`
//! (psql's include command), which stands for the part's text after its header; a part may
//! include another. The six ways to store a key (`idempotency_keys/complete_*`) share their key
//! row's writes and checks, the two claims their end, the statements with a filter its
//! conditions. The includes are resolved at compile time ([`expand`], in `const` items): no
//! statement is built at run time, and each constant's text is one `&'static str`.
//!
//! The tests (`store::statements::tests`, the last against a migrated database) check that every file and part is listed here and every entry has its file, that
//! every part is included, that each header names exactly the parameters its statement (parts
//! included) uses, and that every statement prepares against the latest schema.

use tokio_postgres::types::{ToSql, Type};

use super::Param;

/// A statement of the registry: the text sent, and the types of its parameters, $1 first, as
/// its file's header declares them (`-- $N name: type`, read at compile time). The header is the
/// one place a parameter's type is written: the tests prepare each statement with those types
/// against the latest schema, and the store binds its values with them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Statement {
    /// The text sent.
    pub(crate) sql: &'static str,
    /// The declared types of $1, $2, ...
    pub(crate) types: &'static [Type],
}

impl Statement {
    /// `values` ($1 first), each with its declared type.
    pub(crate) fn bind<'a>(&self, values: &[&'a (dyn ToSql + Sync)]) -> Vec<Param<'a>> {
        debug_assert_eq!(values.len(), self.types.len(), "{}", self.sql);
        values
            .iter()
            .copied()
            .zip(self.types.iter().cloned())
            .collect()
    }
}

/// The text sent.
impl std::fmt::Display for Statement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.sql)
    }
}

/// The type a header names (`text`, `uuid[]`, ...): the built-in types the statements take.
const fn type_named(name: &[u8]) -> Type {
    match name {
        b"bool" => Type::BOOL,
        b"bytea" => Type::BYTEA,
        b"float4" => Type::FLOAT4,
        b"float8" => Type::FLOAT8,
        b"float8[]" => Type::FLOAT8_ARRAY,
        b"int2" => Type::INT2,
        b"int4" => Type::INT4,
        b"int4[]" => Type::INT4_ARRAY,
        b"int8" => Type::INT8,
        b"int8[]" => Type::INT8_ARRAY,
        b"jsonb" => Type::JSONB,
        b"jsonb[]" => Type::JSONB_ARRAY,
        b"text" => Type::TEXT,
        b"text[]" => Type::TEXT_ARRAY,
        b"timestamptz" => Type::TIMESTAMPTZ,
        b"timestamptz[]" => Type::TIMESTAMPTZ_ARRAY,
        b"uuid" => Type::UUID,
        b"uuid[]" => Type::UUID_ARRAY,
        _ => panic!("a header names a parameter type the store does not bind"),
    }
}

/// Reads the `-- $N name: type` lines of `file`'s `-- Parameters:` section (the end of its
/// header) into `out` (`$N`'s type at `N - 1`); returns how many there are. With an empty `out`
/// it writes nothing and only counts.
const fn declared(file: &str, out: &mut [Type]) -> usize {
    let bytes = file.as_bytes();
    let end = header_end(file);
    let (mut start, mut listing, mut count) = (0, false, 0);
    while start < end {
        let mut stop = start;
        while stop < end && bytes[stop] != b'\n' {
            stop += 1;
        }
        let line = slice(bytes, start, stop);
        if line.len() > 13 && same(slice(line, 0, 13), b"-- Parameters") {
            listing = true;
        } else if listing && line.len() > 4 && same(slice(line, 0, 4), b"-- $") {
            let (mut at, mut number) = (4, 0);
            while at < line.len() && line[at].is_ascii_digit() {
                number = number * 10 + (line[at] - b'0') as usize;
                at += 1;
            }
            while at < line.len() && line[at] != b':' {
                at += 1;
            }
            if !out.is_empty() {
                let name = slice(line, at + 1, line.len()).trim_ascii();
                // Forgotten, not dropped: a `const fn` cannot run `Type`'s destructor, and a
                // built-in type owns nothing.
                core::mem::forget(core::mem::replace(&mut out[number - 1], type_named(name)));
            }
            count += 1;
        }
        start = stop + 1;
    }
    count
}

/// The `N` types [`declared`] reads from `file`'s header.
pub(crate) const fn declared_types<const N: usize>(file: &str) -> [Type; N] {
    let mut out = [Type::TEXT; N];
    declared(file, &mut out);
    out
}

/// Where the text of a `.sql` file starts: after its opening `--` lines.
const fn header_end(file: &str) -> usize {
    let bytes = file.as_bytes();
    let mut at = 0;
    while at + 1 < bytes.len() && bytes[at] == b'-' && bytes[at + 1] == b'-' {
        while at < bytes.len() && bytes[at] != b'\n' {
            at += 1;
        }
        at += 1;
    }
    if at > bytes.len() {
        bytes.len()
    } else {
        at
    }
}

/// The statement of a `.sql` file that includes no part: its text after the opening `--` lines
/// (the header documents it; it is not sent with every execution, and `pg_stat_activity` shows
/// the statement alone).
#[cfg(test)]
pub(crate) const fn statement(file: &'static str) -> &'static str {
    file.split_at(header_end(file)).1.trim_ascii()
}

/// `bytes[from..to]`, in a `const fn`.
const fn slice(bytes: &[u8], from: usize, to: usize) -> &[u8] {
    bytes.split_at(to).0.split_at(from).1
}

/// Whether `a` and `b` hold the same bytes, in a `const fn`.
const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The text of `parts`' entry named `name` (its path under `store/sql/`).
const fn part<'a>(parts: &[(&str, &'a str)], name: &[u8]) -> &'a str {
    let mut i = 0;
    while i < parts.len() {
        if same(parts[i].0.as_bytes(), name) {
            return parts[i].1;
        }
        i += 1;
    }
    panic!("a `\\i` line names a part that is not in the registry's `parts`")
}

/// Writes the text of `file` after its header into `out` from `at`, each line `\i <part>`
/// replaced by that part's text after its header (itself expanded, `depth` deep); returns where
/// the text ends. With an empty `out` it writes nothing and only counts.
pub(crate) const fn expand(
    file: &str,
    parts: &[(&str, &str)],
    out: &mut [u8],
    mut at: usize,
    depth: usize,
) -> usize {
    assert!(depth < 4, "parts that include each other in a loop");
    let bytes = file.as_bytes();
    let mut start = header_end(file);
    while start < bytes.len() {
        let mut end = start;
        while end < bytes.len() && bytes[end] != b'\n' {
            end += 1;
        }
        let line = slice(bytes, start, end);
        let next = if end < bytes.len() { end + 1 } else { end };
        if line.len() > 3 && same(slice(line, 0, 3), b"\\i ") {
            let name = slice(line, 3, line.len()).trim_ascii();
            at = expand(part(parts, name), parts, out, at, depth + 1);
        } else {
            let mut i = start;
            while i < next {
                if !out.is_empty() {
                    out[at] = bytes[i];
                }
                at += 1;
                i += 1;
            }
        }
        start = next;
    }
    at
}

/// The `LEN` bytes of `file`'s statement with its parts in place ([`expand`]; `LEN` is what
/// `expand` counts).
pub(crate) const fn assemble<const LEN: usize>(file: &str, parts: &[(&str, &str)]) -> [u8; LEN] {
    let mut out = [0; LEN];
    expand(file, parts, &mut out, 0, 0);
    out
}

/// The statement `assemble` wrote, without the white space around it.
pub(crate) const fn sent(text: &'static [u8]) -> &'static str {
    match core::str::from_utf8(text) {
        Ok(text) => text.trim_ascii(),
        Err(_) => panic!("a statement that is not UTF-8"),
    }
}

/// Declares the parts the statements include (their paths under `store/sql/`, without `.sql`),
/// then, for each table folder, a module of constants (one per statement: its file's text after
/// the header, each `\i <part>` line replaced by the part, [`expand`], and its header's
/// parameter types, [`declared`]) and the registry of them all, named `<folder>/<file>` after
/// their files.
macro_rules! statements {
    (
        parts { $($part:literal,)* }
        $($folder:ident { $($name:ident = $file:literal,)* })*
    ) => {
        /// Every part a statement includes: the name its `\i` lines give it (its path under
        /// `store/sql/`) and its file's text, header included.
        pub(crate) const PARTS: &[(&str, &str)] = &[
            $((concat!($part, ".sql"), include_str!(concat!("sql/", $part, ".sql"))),)*
        ];

        $(
            #[doc = concat!("The statements of `store/sql/", stringify!($folder), "/`.")]
            pub(crate) mod $folder {
                $(
                    #[doc = concat!("`", stringify!($folder), "/", $file, ".sql`.")]
                    pub(crate) const $name: super::Statement = {
                        const FILE: &str = include_str!(concat!(
                            "sql/", stringify!($folder), "/", $file, ".sql"
                        ));
                        const LEN: usize = super::expand(FILE, super::PARTS, &mut [], 0, 0);
                        const TEXT: [u8; LEN] = super::assemble(FILE, super::PARTS);
                        const PARAMS: usize = super::declared(FILE, &mut []);
                        const TYPES: [super::Type; PARAMS] = super::declared_types(FILE);
                        super::Statement { sql: super::sent(&TEXT), types: &TYPES }
                    };
                )*
            }
        )*

        /// Every statement of the core: its name (`<folder>/<file>`, the path of its file under
        /// `store/sql/` without `.sql`), its file's text, header included, and the constant (the
        /// text sent and the types bound). Read by the tests; the store's functions use the
        /// constants.
        #[cfg_attr(not(test), allow(dead_code))]
        pub(crate) static STATEMENTS: &[(&str, &str, Statement)] = &[
            $($((
                concat!(stringify!($folder), "/", $file),
                include_str!(concat!("sql/", stringify!($folder), "/", $file, ".sql")),
                $folder::$name,
            ),)*)*
        ];
    };
}

statements! {
    parts {
        "destinations/parts/flow_columns",
        "idempotency_keys/parts/checks",
        "idempotency_keys/parts/insert_key",
        "idempotency_keys/parts/kept_effects",
        "idempotency_keys/parts/messages",
        "idempotency_keys/parts/messages_end",
        "idempotency_keys/parts/ordered_messages",
        "idempotency_keys/parts/take_over_key",
        "idempotency_keys/parts/update_key",
        "messages/parts/claim_end",
        "messages/parts/error_class",
        "messages/parts/error_filter",
        "messages/parts/filter",
        "messages/parts/insert_waiting",
    }
    idempotency_keys {
        AWAITING_FAN_OUT = "awaiting_fan_out",
        CLAIM = "claim",
        COMPLETE_INSERT = "complete_insert",
        COMPLETE_INSERT_WITH_MESSAGES = "complete_insert_with_messages",
        COMPLETE_INSERT_WITH_ORDERED_MESSAGES = "complete_insert_with_ordered_messages",
        COMPLETE_TAKE_OVER = "complete_take_over",
        COMPLETE_TAKE_OVER_WITH_MESSAGES = "complete_take_over_with_messages",
        COMPLETE_TAKE_OVER_WITH_ORDERED_MESSAGES = "complete_take_over_with_ordered_messages",
        COMPLETE_UPDATE = "complete_update",
        COMPLETE_UPDATE_WITH_MESSAGES = "complete_update_with_messages",
        COMPLETE_UPDATE_WITH_ORDERED_MESSAGES = "complete_update_with_ordered_messages",
        FAN_OUT = "fan_out",
        LOCK_TRY = "lock_try",
        LOCK_WAIT = "lock_wait",
        LOOKUP = "lookup",
        LOOKUP_RESTORE = "lookup_restore",
        PRUNE_EXPIRED = "prune_expired",
        SHOW = "show",
        STATS_FAN_OUT = "stats_fan_out",
    }
    messages {
        ANALYZE = "analyze",
        BY_REQUEST_KEY = "by_request_key",
        CLAIM = "claim",
        CLAIM_UNBOUNDED = "claim_unbounded",
        DISCARD_SELECT = "discard_select",
        FAILURE_GROUPS = "failure_groups",
        INSERT = "insert",
        INSERT_ORDERED = "insert_ordered",
        LIST = "list",
        LOCK_ORDERING_KEYS = "lock_ordering_keys",
        LOCK_ORDERING_KEYS_BRIEFLY = "lock_ordering_keys_briefly",
        MARK_STARTED = "mark_started",
        PURGE_BATCH = "purge_batch",
        PURGE_COUNTS = "purge_counts",
        RECLAIM_EXPIRED = "reclaim_expired",
        RELEASE_UNSTARTED = "release_unstarted",
        REPLAY = "replay",
        REPLAY_KEY_TAKEN = "replay_key_taken",
        REPLAY_LOCK = "replay_lock",
        REPLAY_READ = "replay_read",
        REPLAY_SELECT = "replay_select",
        SAMPLE_BACKLOG = "sample_backlog",
        SHOW = "show",
        STATISTICS = "statistics",
        STATS_COUNTS = "stats_counts",
        STATS_FEW = "stats_few",
        STATS_OLDEST_PENDING = "stats_oldest_pending",
        STATS_SAMPLE = "stats_sample",
        STATS_TUPLES = "stats_tuples",
        UNPARK_FREED = "unpark_freed",
        UNPARK_STRANDED = "unpark_stranded",
    }
    attempt_log {
        ACTIVITY = "activity",
        COMPLETE = "complete",
        HISTORY = "history",
        LOG_DESTINATION_ACTION = "log_destination_action",
        LOG_REPLAYS = "log_replays",
        PURGE_ORPHANS_BATCH = "purge_orphans_batch",
        STATS = "stats",
    }
    destinations {
        ENSURE = "ensure",
        FLOW_STATE = "flow_state",
        FLOW_STATES = "flow_states",
        KNOWN = "known",
        LOCK = "lock",
        NAMED = "named",
        PAUSE = "pause",
        REGISTER = "register",
        RESUME = "resume",
        UPDATE_BREAKERS = "update_breakers",
    }
    inbox {
        COUNT_EXPIRED = "count_expired",
        LOOKUP = "lookup",
        PRUNE_EXPIRED = "prune_expired",
        RECORD = "record",
        SHOW = "show",
        STATS = "stats",
        TAKE_OVER = "take_over",
    }
    relays {
        HEARTBEAT = "heartbeat",
        LIST = "list",
        PRUNE = "prune",
        REGISTER = "register",
        REMOVE = "remove",
    }
    delivered {
        PURGE_BATCH = "purge_batch",
        REPLAY_LOCK = "replay_lock",
        REPLAY_MOVE = "replay_move",
        REPLAY_READ = "replay_read",
        STATS_ESTIMATE = "stats_estimate",
        STATS_EXACT = "stats_exact",
    }
    discarded {
        DISCARD = "discard",
        EXISTS = "exists",
        PURGE_BATCH = "purge_batch",
        STATS_COUNTS = "stats_counts",
    }
    schema_history {
        VERSION = "version",
    }
    session {
        ADVISORY_LOCK = "advisory_lock",
        ADVISORY_UNLOCK = "advisory_unlock",
        LISTEN = "listen",
        NOTIFY = "notify",
        PURGE_CUTOFF = "purge_cutoff",
        REPLAY_LOCK_TIMEOUT = "replay_lock_timeout",
    }
}

#[cfg(test)]
mod tests;
