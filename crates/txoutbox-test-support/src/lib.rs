//! The test harness: a real Postgres for every test, one fresh database each.
//!
//! - With `DATABASE_URL` set, it is the admin connection (a role that may create databases).
//! - Without it, a throwaway cluster is started from the `initdb`/`pg_ctl` found on `PATH` or under
//!   `/usr/lib/postgresql/*/bin`, in `target/txoutbox-pg` (shared by every test process of a run
//!   and left running for the next one; `./scripts/test --stop` stops it, as root or as a user).
//!
//! A template database is migrated once per schema version; every test clones it
//! (`CREATE DATABASE … TEMPLATE …`) and drops its clone when the [`TestDb`] is dropped, so tests run
//! in parallel and never see each other's rows. Tests that stop or restart Postgres take a
//! [`Cluster::private`] of their own.
//!
//! [`smtp::SmtpServer`] runs a real SMTP server (Debian's aiosmtpd) for the email tests;
//! [`prometheus::sample`] reads one series of a metrics scrape; [`raw_http::RawHttpServer`] is a
//! hostile HTTP peer (binary or endless bodies, silence, dropped connections) for the sinks' tests;
//! [`tls::TestCa`] makes the certificates of a TLS cluster ([`ClusterOptions::tls`]).
//!
//! Arranging a test: [`factory::message`] writes outbox rows in any state; [`counts`] reads
//! [`Counts`] of where the rows are and [`wait_until`] waits for a state by meaning (no sleeps);
//! [`assert_outcomes`] checks a row's attempt log; [`relay::relay_config`] and [`relay::short_lease`] are relay
//! timings for tests; [`webhook::WebhookReceiver`] is a scripted HTTP receiver for real relays;
//! [`free_port`] picks a loopback port; [`DemoDatabase`] is the database of a demo or an example
//! program; [`webdriver::Driver`] drives a headless chromium for the
//! browser tests. [`select`] reads what a test's own `SELECT` returns; [`serve_on_loopback`] (or
//! [`LoopbackServer`], stopped when dropped) and [`http_client`] are both ends of HTTP on
//! loopback; [`process::OwnedChild`] holds a child process and kills it when dropped.

mod cluster;
mod counts;
mod database;
mod demo_db;
mod doc;
pub mod factory;
pub mod fake_stripe;
mod http;
mod port;
pub mod prometheus;
pub mod raw_http;
pub mod relay;
pub mod request;
pub mod smtp;
pub mod tls;
pub mod webdriver;
pub mod webhook;

pub use cluster::{Cluster, ClusterOptions};
pub use counts::{
    assert_outcomes, count, counts, counts_for, outcomes, status, wait_for_count,
    wait_for_exact_count, wait_until, wait_until_within, Counts, WAIT_LIMIT,
};
pub use database::{
    drop_schema, forget_last_migration, latest_migration, record_newer_migration, test_db,
    test_db_with_client, test_db_with_sql, ConnInfo, TestDb,
};
pub use demo_db::DemoDatabase;
pub use doc::doc_test;
pub use http::{
    http_client, post_json_with_key, rebound_pause, request_text, serve_on_loopback, LoopbackServer,
};
pub use port::{free_addr, free_port};

/// Waiting on a relay's test events ([`events::RelayEvents`]) instead of sleeping.
pub mod events;
pub use events::{is_claim, RelayEvents};
pub use txoutbox::relay::RelayEvent;

/// Waits for a condition a test names, and typed reads the counts do not cover.
pub mod wait;
pub use wait::{
    due, eventually, eventually_async, eventually_some, keys_expired, keys_with_effects, leased_by,
    other_sessions_ended,
};

/// A service's `charges` table and the completion hook that writes it.
pub mod hooks;

/// A relay killed after its sink was called, before the outcome was written.
pub mod crash;
pub use crash::{abort_after_a_call, drain_across_a_restart, kill_after_a_call};

mod rows;
/// A test's own `SELECT`, read as one value or as columns.
pub mod select;
pub use rows::{
    assert_keys_derived_from_the_inbox, attempts_of, delivered_attempts, downstream_key_of, log_of,
    logged, receipt_of, row_status, wait_for_key, wait_for_row, wait_until_for, LogEntry,
};
pub mod process;
