//! `txoutbox-bench`'s library: the fault-injection soak ([`soak`]), which the `soak` subcommand
//! and the crate's tests run. The throughput benchmarks live in the binary.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! let options = txoutbox_bench::soak::SoakOptions::new(42, "target/debug/txoutbox".into());
//! let report = txoutbox_bench::soak::run(&options).await?;
//! print!("{}", report.table());
//! assert!(report.violations.is_empty());
//! # Ok(()) }
//! ```

pub mod soak;
