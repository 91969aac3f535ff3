//! What a soak found, and the table and violation lines printed at the end of a run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::check::{Figures, Violation, INVARIANTS};

/// What a soak found.
#[derive(Debug)]
pub struct SoakReport {
    /// The seed.
    pub seed: u64,
    /// The plan's digest.
    pub digest: u64,
    /// Rows enqueued.
    pub rows: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Final states, calls.
    pub figures: Figures,
    /// What the write path's requests did, by kind.
    pub requests: BTreeMap<String, u64>,
    /// Every broken invariant.
    pub violations: Vec<Violation>,
    /// Operator commands that failed, unexpected requests: context, not verdicts.
    pub notes: Vec<String>,
    /// The relays' logs.
    pub log_dir: PathBuf,
    /// Wall time of the run.
    pub took: Duration,
}

impl SoakReport {
    /// The violations, one a line, at most `per_invariant` of each invariant (then a count of
    /// the rest).
    pub fn violation_lines(&self, per_invariant: usize) -> String {
        let mut t = String::new();
        for (name, _) in INVARIANTS {
            let of: Vec<&Violation> = self
                .violations
                .iter()
                .filter(|v| v.invariant == name)
                .collect();
            for v in of.iter().take(per_invariant) {
                let _ = writeln!(t, "violation {v}");
            }
            if of.len() > per_invariant {
                let _ = writeln!(
                    t,
                    "violation [{name}]: … and {} more",
                    of.len() - per_invariant
                );
            }
        }
        t
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "txoutbox soak: seed {}, plan {:016x}, {:.0} s",
            self.seed,
            self.digest,
            self.took.as_secs_f64()
        );
        let _ = writeln!(t, "rows                      {:>8}", self.rows);
        for (state, n) in &self.figures.states {
            let _ = writeln!(t, "  {state:<38} {n:>6}");
        }
        let _ = writeln!(
            t,
            "requests                  {:>8}",
            ["committed", "commit answer lost", "not committed"]
                .iter()
                .filter_map(|k| self.requests.get(*k))
                .sum::<u64>()
        );
        for (what, n) in &self.requests {
            let _ = writeln!(t, "  {what:<38} {n:>6}");
        }
        let _ = writeln!(
            t,
            "faults injected           {:>8}",
            self.faults.values().sum::<u64>()
        );
        for (kind, n) in &self.faults {
            let _ = writeln!(t, "  {kind:<38} {n:>6}");
        }
        let _ = writeln!(t, "downstream calls          {:>8}", self.figures.calls);
        let _ = writeln!(
            t,
            "calls per row             max {}, p99 {}",
            self.figures.max_calls, self.figures.p99_calls
        );
        let _ = writeln!(
            t,
            "invariant violations      {:>8}   (0 expected)",
            self.violations.len()
        );
        for (name, what) in INVARIANTS {
            let n = self
                .violations
                .iter()
                .filter(|v| v.invariant == name)
                .count();
            let _ = writeln!(t, "  {n:>5}  {name:<19} {what}");
        }
        t
    }
}
