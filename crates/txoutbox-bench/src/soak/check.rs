//! The invariants, checked once every relay has stopped: what the database says against what
//! the downstream saw and what the soak did.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use uuid::Uuid;

use super::downstream::Call;
use super::plan::{Plan, RowPlan};
use super::relays::Exit;

/// The invariants, in report order: (name, what holds).
pub const INVARIANTS: [(&str, &str); 11] = [
    (
        "settled",
        "every row ends delivered, failed or unknown (or waits behind a dead-lettered head)",
    ),
    ("reason", "every failed or unknown row carries a reason"),
    (
        "not-leased",
        "no row is left in_flight once the relays have stopped",
    ),
    (
        "calls-logged",
        "every call the downstream saw is in txoutbox_attempts",
    ),
    (
        "calls-bounded",
        "calls per row never exceed the attempts allowed",
    ),
    (
        "one-call-at-a-time",
        "the calls of one row never overlap at the downstream",
    ),
    (
        "ordering",
        "rows of one ordering key never overlap and arrive in order",
    ),
    (
        "relay-exit",
        "every relay exits 0 within grace + 5 s of SIGTERM, and only then",
    ),
    (
        "unknown-called",
        "unknown only where a call was really started",
    ),
    (
        "at-most-once",
        "an at-most-once row's effect happens at most once",
    ),
    (
        "delivered-accepted",
        "a delivered row was accepted by the downstream",
    ),
];

/// One broken invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The invariant's name (see [`INVARIANTS`]).
    pub invariant: &'static str,
    /// The row, when it is about one.
    pub row: Option<usize>,
    /// The row's message id, when known.
    pub id: Option<Uuid>,
    /// What was observed.
    pub observed: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.invariant)?;
        if let Some(row) = self.row {
            write!(f, " row {row}")?;
        }
        if let Some(id) = self.id {
            write!(f, " ({id})")?;
        }
        write!(f, ": {}", self.observed)
    }
}

/// A row of the hot table at the end.
#[derive(Debug, Clone)]
pub struct HotRow {
    /// Its id.
    pub id: Uuid,
    /// `pending`, `in_flight`, `failed` or `unknown`.
    pub status: String,
    /// The last failure's text.
    pub last_error: Option<String>,
    /// The lease holder, while in flight.
    pub lease_owner: Option<String>,
    /// Attempts of the current generation.
    pub attempts: i32,
    /// Seconds until the next attempt is due (negative: overdue).
    pub due_in: f64,
}

/// One line of the attempt log.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The relay owner, or `operator`.
    pub relay: String,
    /// Its outcome.
    pub outcome: String,
}

/// What the database holds at the end, by row index.
#[derive(Debug, Default)]
pub struct Final {
    /// Rows still in the hot table.
    pub hot: HashMap<usize, HotRow>,
    /// Rows that were moved to the delivered history (even if purged since), with their ids.
    pub delivered: HashMap<usize, Uuid>,
    /// The attempt log (copied by trigger, so a purge does not hide it), by row.
    pub attempts: HashMap<usize, Vec<Attempt>>,
}

/// The figures of the report.
#[derive(Debug, Default)]
pub struct Figures {
    /// Rows by final state.
    pub states: BTreeMap<String, usize>,
    /// Calls the downstream saw.
    pub calls: usize,
    /// Most calls of one row.
    pub max_calls: usize,
    /// 99th percentile of calls per row.
    pub p99_calls: usize,
}

/// Checks every invariant; returns the violations and the figures.
pub fn check(
    plan: &Plan,
    max_attempts: u32,
    grace: Duration,
    calls: &[Call],
    state: &Final,
    exits: &[Exit],
    killed: &std::collections::HashSet<String>,
) -> (Vec<Violation>, Figures) {
    let mut out = Vec::new();
    let mut by_row: HashMap<usize, Vec<&Call>> = HashMap::new();
    for call in calls {
        by_row.entry(call.row).or_default().push(call);
    }
    let end_of = |c: &Call| c.end.unwrap_or(Duration::MAX);
    let mut figures = Figures {
        calls: calls.len(),
        ..Figures::default()
    };
    // The final status of each row, for the ordering keys' heads.
    let status = |row: usize| -> &str {
        match (state.hot.get(&row), state.delivered.contains_key(&row)) {
            (Some(h), _) => h.status.as_str(),
            (None, true) => "delivered",
            (None, false) => "lost",
        }
    };
    let mut keys: HashMap<&str, Vec<&RowPlan>> = HashMap::new();
    for row in &plan.rows {
        if let Some((key, _)) = &row.ordering {
            keys.entry(key.as_str()).or_default().push(row);
        }
    }
    for rows in keys.values_mut() {
        rows.sort_by_key(|r| r.ordering.as_ref().map(|(_, p)| *p));
    }
    let blocked = |row: &RowPlan| -> bool {
        let Some((key, position)) = &row.ordering else {
            return false;
        };
        keys.get(key.as_str()).is_some_and(|rows| {
            rows.iter()
                .filter(|r| r.ordering.as_ref().is_some_and(|(_, p)| p < position))
                .any(|r| matches!(status(r.index), "failed" | "unknown"))
        })
    };
    // For a pending ordered row: the earliest earlier row of its key still in the outbox.
    let waiting_behind = |row: &RowPlan| -> String {
        let Some((key, position)) = &row.ordering else {
            return String::new();
        };
        let head = keys.get(key.as_str()).and_then(|rows| {
            rows.iter().find(|r| {
                r.ordering.as_ref().is_some_and(|(_, p)| p < position)
                    && state.hot.contains_key(&r.index)
            })
        });
        match head {
            Some(head) => format!(
                " (waits behind row {} of {key}, itself {})",
                head.index,
                status(head.index)
            ),
            None => format!(" ({key}, nothing before it)"),
        }
    };
    let mut per_row_calls = Vec::new();
    for row in &plan.rows {
        let i = row.index;
        let hot = state.hot.get(&i);
        let id = hot
            .map(|h| h.id)
            .or_else(|| state.delivered.get(&i).copied());
        let mut violation = |invariant: &'static str, observed: String| {
            out.push(Violation {
                invariant,
                row: Some(i),
                id,
                observed,
            });
        };
        let row_calls = by_row.get(&i).map(Vec::as_slice).unwrap_or(&[]);
        per_row_calls.push(row_calls.len());
        let attempts = state.attempts.get(&i).map(Vec::as_slice).unwrap_or(&[]);
        let logged = attempts.iter().filter(|a| a.relay != "operator").count();
        let replays = attempts.iter().filter(|a| a.outcome == "replayed").count();
        let applied = row_calls.iter().filter(|c| c.applied).count();
        let mut final_state = status(i).to_owned();
        match hot {
            Some(h) if h.status == "pending" && blocked(row) => {
                final_state = "pending behind a dead-lettered head".to_owned();
            }
            Some(h) if h.status == "pending" => violation(
                "settled",
                format!(
                    "still pending after the settle deadline{}: {} attempts, next attempt {}, \
                     {} calls seen, last error: {}",
                    waiting_behind(row),
                    h.attempts,
                    if h.due_in > 0.0 {
                        format!("in {:.0} s", h.due_in)
                    } else {
                        format!("overdue by {:.0} s", -h.due_in)
                    },
                    row_calls.len(),
                    shorten(h.last_error.as_deref())
                ),
            ),
            Some(h) if h.status == "in_flight" => violation(
                "not-leased",
                format!(
                    "in_flight after every relay stopped, leased by {} ({}), {} attempts, last \
                     error: {}",
                    h.lease_owner.as_deref().unwrap_or("?"),
                    match h.lease_owner.as_deref() {
                        Some(o) if killed.contains(o) => "SIGKILLed",
                        _ => "stopped by SIGTERM",
                    },
                    h.attempts,
                    shorten(h.last_error.as_deref())
                ),
            ),
            Some(h) => {
                if h.last_error.as_deref().is_none_or(|e| e.trim().is_empty()) {
                    violation("reason", format!("{} without a last_error", h.status));
                }
            }
            None if state.delivered.contains_key(&i) => {}
            None => violation(
                "settled",
                format!(
                    "neither in the outbox nor delivered (lost); {} calls seen",
                    row_calls.len()
                ),
            ),
        }
        *figures.states.entry(final_state).or_default() += 1;
        if row_calls.len() > logged {
            violation(
                "calls-logged",
                format!(
                    "the downstream saw {} calls, txoutbox_attempts logs {} relay attempts ({})",
                    row_calls.len(),
                    logged,
                    outcomes(attempts)
                ),
            );
        }
        let allowed = max_attempts as usize * (1 + replays);
        if row_calls.len() > allowed {
            violation(
                "calls-bounded",
                format!(
                    "{} calls, at most {allowed} allowed ({max_attempts} attempts x {} \
                     generations); answers: {}",
                    row_calls.len(),
                    1 + replays,
                    answers(row_calls)
                ),
            );
        }
        let mut sorted: Vec<&Call> = row_calls.to_vec();
        sorted.sort_by_key(|c| c.start);
        let mut open_until = Duration::ZERO;
        for c in &sorted {
            if c.start < open_until {
                violation(
                    "one-call-at-a-time",
                    format!(
                        "a call arrived at {:.3} s while an earlier call was open until {:.3} s",
                        c.start.as_secs_f64(),
                        secs(open_until)
                    ),
                );
                break;
            }
            open_until = open_until.max(end_of(c));
        }
        if hot.is_some_and(|h| h.status == "unknown") {
            let unexempt = attempts
                .iter()
                .filter(|a| a.outcome == "unknown" && !killed.contains(&a.relay))
                .count();
            if unexempt > row_calls.len() {
                violation(
                    "unknown-called",
                    format!(
                        "{unexempt} unknown outcomes by relays that were not SIGKILLed, but \
                         the downstream saw {} calls ({})",
                        row_calls.len(),
                        outcomes(attempts)
                    ),
                );
            }
        }
        if row.at_most_once() && applied > 1 {
            violation(
                "at-most-once",
                format!(
                    "the effect happened {applied} times; answers: {}",
                    answers(row_calls)
                ),
            );
        }
        if hot.is_none() && state.delivered.contains_key(&i) && applied == 0 {
            violation(
                "delivered-accepted",
                format!(
                    "delivered, but the downstream never accepted it; answers: {}",
                    answers(row_calls)
                ),
            );
        }
    }
    // Ordering keys: every call of a row comes after every call of the rows before it ended.
    let mut names: Vec<&&str> = keys.keys().collect();
    names.sort();
    for key in names {
        let rows = &keys[*key];
        let mut before_end = Duration::ZERO;
        let mut before_row = None;
        for row in rows {
            let row_calls = by_row.get(&row.index).map(Vec::as_slice).unwrap_or(&[]);
            if let Some(first) = row_calls.iter().map(|c| c.start).min() {
                if first < before_end {
                    out.push(Violation {
                        invariant: "ordering",
                        row: Some(row.index),
                        id: state
                            .hot
                            .get(&row.index)
                            .map(|h| h.id)
                            .or_else(|| state.delivered.get(&row.index).copied()),
                        observed: format!(
                            "{key} position {}: called at {:.3} s, before a call of row {} \
                             (earlier in the key) ended at {:.3} s",
                            row.ordering.as_ref().map(|(_, p)| *p).unwrap_or(0),
                            first.as_secs_f64(),
                            before_row.unwrap_or(0),
                            secs(before_end)
                        ),
                    });
                }
            }
            if let Some(last) = row_calls.iter().map(|c| end_of(c)).max() {
                if last > before_end {
                    before_end = last;
                    before_row = Some(row.index);
                }
            }
        }
    }
    let limit = grace + Duration::from_secs(5);
    for exit in exits {
        let observed = match (exit.asked, exit.status) {
            (false, Some(status)) => Some(format!("exited unasked ({status})")),
            (_, None) => Some(format!(
                "did not exit within {:.1} s of SIGTERM and was SIGKILLed",
                exit.took.as_secs_f64()
            )),
            (true, Some(status)) if !status.success() => {
                Some(format!("exited with {status} after SIGTERM"))
            }
            (true, Some(_)) if exit.took > limit => Some(format!(
                "exited {:.1} s after SIGTERM (limit {:.1} s)",
                exit.took.as_secs_f64(),
                limit.as_secs_f64()
            )),
            _ => None,
        };
        if let Some(observed) = observed {
            let tail = if exit.log_tail.is_empty() {
                String::new()
            } else {
                format!("; log ends: {}", shorten(Some(&exit.log_tail)))
            };
            out.push(Violation {
                invariant: "relay-exit",
                row: None,
                id: None,
                observed: format!("relay {} {observed}{tail}", exit.owner),
            });
        }
    }
    per_row_calls.sort_unstable();
    figures.max_calls = per_row_calls.last().copied().unwrap_or(0);
    if !per_row_calls.is_empty() {
        let at = ((per_row_calls.len() as f64) * 0.99).ceil() as usize;
        figures.p99_calls = per_row_calls[at.clamp(1, per_row_calls.len()) - 1];
    }
    (out, figures)
}

fn secs(d: Duration) -> f64 {
    if d == Duration::MAX {
        f64::INFINITY
    } else {
        d.as_secs_f64()
    }
}

/// An error text made printable: NULs and control characters escaped, cut to 200 characters.
fn shorten(text: Option<&str>) -> String {
    let Some(text) = text else {
        return "(none)".to_owned();
    };
    let escaped: String = text.escape_debug().collect();
    if escaped.chars().count() > 200 {
        format!("{}…", escaped.chars().take(200).collect::<String>())
    } else {
        escaped
    }
}

fn outcomes(attempts: &[Attempt]) -> String {
    let list: Vec<String> = attempts
        .iter()
        .map(|a| format!("{} by {}", a.outcome, a.relay))
        .collect();
    if list.is_empty() {
        "none".to_owned()
    } else {
        list.join(", ")
    }
}

fn answers(calls: &[&Call]) -> String {
    let list: Vec<String> = calls
        .iter()
        .map(|c| format!("{:.1}s {}", c.start.as_secs_f64(), c.answer))
        .collect();
    list.join(", ")
}
