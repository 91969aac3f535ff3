//! Every SQL statement of the core, one `.sql` file each under `store/sql/<table>/`, loaded with
//! `include_str!` and listed once in [`STATEMENTS`]. The functions of `store/` run them by the
//! constants below (`statements::messages::CLAIM`); nothing outside `store/` holds statement
//! text.
//!
//! A statement lives in the folder of the table it is mainly about (one that reads or writes
//! several says so in its comment); `session/` holds those about no table (advisory locks,
//! settings, the wake-up channel). Each file opens with `--` lines: what it does, why it is shaped
//! so, then `-- Parameters:` and one `-- $N name: type` line per parameter (`-- Parameters:
//! none.` when it takes none), which the tests read to prepare it with those types. The header
//! stays in the file: the constants hold the statement alone ([`statement`]), the text sent.
//!
//! No statement is built at run time. Those that differ by a part are listed as each of their
//! variants, whole: the six ways to store a key (`idempotency_keys/complete_*`: insert, take over
//! or update the key row, each without and with outbox rows) and the two claims
//! (`messages/claim`, `messages/claim_unbounded`), so that each file is exactly the text sent.
//!
//! The tests (`store::statements::tests`, and `tests/statements.rs` against a migrated
//! database) check that every file is listed here and every entry has its file, that each
//! header names exactly the parameters its statement uses, and that every statement prepares
//! against the latest schema.

/// The statement of a `.sql` file: its text after the opening `--` lines (the header documents
/// it; it is not sent with every execution, and `pg_stat_activity` shows the statement alone).
pub(crate) const fn statement(file: &'static str) -> &'static str {
    let bytes = file.as_bytes();
    let mut at = 0;
    while at + 1 < bytes.len() && bytes[at] == b'-' && bytes[at + 1] == b'-' {
        while at < bytes.len() && bytes[at] != b'\n' {
            at += 1;
        }
        at += 1;
    }
    if at > bytes.len() {
        at = bytes.len();
    }
    file.split_at(at).1.trim_ascii()
}

/// Declares, for each table folder, a module of constants (one per statement, its file's
/// [`statement`]) and the registry of them all, named `<folder>/<file>` after their files.
macro_rules! statements {
    ($($folder:ident { $($name:ident = $file:literal,)* })*) => {
        $(
            #[doc = concat!("The statements of `store/sql/", stringify!($folder), "/`.")]
            pub(crate) mod $folder {
                $(
                    #[doc = concat!("`", stringify!($folder), "/", $file, ".sql`.")]
                    pub(crate) const $name: &str = super::statement(include_str!(concat!(
                        "sql/", stringify!($folder), "/", $file, ".sql"
                    )));
                )*
            }
        )*

        /// Every statement of the core: its name (`<folder>/<file>`, the path of its file under
        /// `store/sql/` without `.sql`) and its file's text, header included. Read by the tests;
        /// the store's functions use the constants.
        #[cfg_attr(not(test), allow(dead_code))]
        pub(crate) static STATEMENTS: &[(&str, &str)] = &[
            $($((
                concat!(stringify!($folder), "/", $file),
                include_str!(concat!("sql/", stringify!($folder), "/", $file, ".sql")),
            ),)*)*
        ];
    };
}

statements! {
    idempotency_keys {
        AWAITING_FAN_OUT = "awaiting_fan_out",
        CLAIM = "claim",
        COMPLETE_INSERT = "complete_insert",
        COMPLETE_INSERT_WITH_MESSAGES = "complete_insert_with_messages",
        COMPLETE_TAKE_OVER = "complete_take_over",
        COMPLETE_TAKE_OVER_WITH_MESSAGES = "complete_take_over_with_messages",
        COMPLETE_UPDATE = "complete_update",
        COMPLETE_UPDATE_WITH_MESSAGES = "complete_update_with_messages",
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
        LIST = "list",
        LOCK_ORDERING_KEYS = "lock_ordering_keys",
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
