//! The invariants, checked once every relay has stopped: what the database says against what
//! the downstream saw, what the writers committed and what the soak did. The checks of one row
//! are in `row`; those across rows (ordering keys, requests, relay exits) here.

mod row;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use uuid::Uuid;

use super::downstream::Call;
use super::plan::{Plan, RowPlan};
use super::relays::Exit;

/// The invariants, in report order: (name, what holds).
pub const INVARIANTS: [(&str, &str); 15] = [
    (
        "settled",
        "every row ends delivered, failed or unknown (or waits behind a dead-lettered head)",
    ),
    (
        "effects-exact",
        "a committed effect is in the outbox once, an uncommitted one never; all or none of a \
         request's",
    ),
    ("reason", "every failed or unknown row carries a reason"),
    (
        "failed-explained",
        "failed only for a permanent answer, an exhausted budget or an undecodable row",
    ),
    (
        "not-leased",
        "no row is left in_flight once the relays have stopped",
    ),
    (
        "downstream-key",
        "every call carries the row's downstream key, the one its writer derived or gave",
    ),
    (
        "request-answers",
        "a request sent again in its window gets its stored response, or a mismatch for \
         another body; a new or expired key is claimed",
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
        "unknown only for at-most-once rows, where a call was really started",
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
    /// The downstream key it carries.
    pub downstream_key: String,
    /// The last failure's text.
    pub last_error: Option<String>,
    /// The lease holder, while in flight.
    pub lease_owner: Option<String>,
    /// Attempts of the current generation.
    pub attempts: i32,
    /// Seconds until the next attempt is due (negative: overdue).
    pub due_in: f64,
}

/// A row moved to the delivered history.
#[derive(Debug, Clone)]
pub struct DeliveredRow {
    /// Its id.
    pub id: Uuid,
    /// The downstream key it carried.
    pub downstream_key: String,
}

/// One line of the attempt log.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The relay owner, or `operator`.
    pub relay: String,
    /// Its outcome.
    pub outcome: String,
}

/// What the database holds at the end, by row index (the payload's `data.row`).
#[derive(Debug, Default)]
pub struct Final {
    /// Rows still in the hot table.
    pub hot: HashMap<usize, HotRow>,
    /// Rows that were moved to the delivered history (even if purged since).
    pub delivered: HashMap<usize, DeliveredRow>,
    /// Every outbox message id seen for a row, hot or delivered: one, unless an effect was
    /// written twice.
    pub copies: HashMap<usize, BTreeSet<Uuid>>,
    /// The attempt log (copied by trigger, so a purge does not hide it), by row.
    pub attempts: HashMap<usize, Vec<Attempt>>,
}

/// Whether a row's transaction committed, as its writer knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// The commit answered: the row must be in the outbox, once.
    Yes,
    /// Nothing that could have written the row committed: it must not be in the outbox.
    No,
    /// The commit's answer was lost: all the effects of its request, or none.
    Maybe,
}

/// What the soak's writers know of a row at the end.
#[derive(Debug, Clone)]
pub struct Expect {
    /// Whether it was committed.
    pub committed: Committed,
    /// The downstream key it must carry: given by its writer, or derived by the documented
    /// rule from (scope, key, effect, the claim that committed it). `None` when nothing
    /// committed it.
    pub key: Option<String>,
    /// The request it is an effect of (rows of one request commit together).
    pub request: Option<usize>,
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

/// Everything a check reads.
pub struct Inputs<'a> {
    /// The plan.
    pub plan: &'a Plan,
    /// What the writers know of each row, by index (a row missing here was never written).
    pub expect: &'a HashMap<usize, Expect>,
    /// The relays' `--max-attempts`.
    pub max_attempts: u32,
    /// The relays' shutdown grace.
    pub grace: Duration,
    /// Every call the downstream saw.
    pub calls: &'a [Call],
    /// The database at the end.
    pub state: &'a Final,
    /// How the relays exited.
    pub exits: &'a [Exit],
    /// The relay owners that were SIGKILLed.
    pub killed: &'a HashSet<String>,
}

/// The shared view of one check: the inputs, indexed.
struct Ctx<'a> {
    input: &'a Inputs<'a>,
    by_row: HashMap<usize, Vec<&'a Call>>,
    keys: HashMap<&'a str, Vec<&'a RowPlan>>,
    out: Vec<Violation>,
}

impl<'a> Ctx<'a> {
    fn new(input: &'a Inputs<'a>) -> Self {
        let mut by_row: HashMap<usize, Vec<&Call>> = HashMap::new();
        for call in input.calls {
            by_row.entry(call.row).or_default().push(call);
        }
        let mut keys: HashMap<&str, Vec<&RowPlan>> = HashMap::new();
        for row in &input.plan.rows {
            if let Some((key, _)) = &row.ordering {
                keys.entry(key.as_str()).or_default().push(row);
            }
        }
        for rows in keys.values_mut() {
            rows.sort_by_key(|r| r.ordering.as_ref().map(|(_, p)| *p));
        }
        Ctx {
            input,
            by_row,
            keys,
            out: Vec::new(),
        }
    }

    /// The final status of a row: its hot status, `delivered`, or `absent`.
    fn status(&self, row: usize) -> &str {
        let state = self.input.state;
        match (state.hot.get(&row), state.delivered.contains_key(&row)) {
            (Some(h), _) => h.status.as_str(),
            (None, true) => "delivered",
            (None, false) => "absent",
        }
    }

    /// The row's message id, when it has one.
    fn id(&self, row: usize) -> Option<Uuid> {
        let state = self.input.state;
        state
            .hot
            .get(&row)
            .map(|h| h.id)
            .or_else(|| state.delivered.get(&row).map(|d| d.id))
    }

    /// The row's attempt log as the soak copied it.
    fn attempts(&self, row: usize) -> &'a [Attempt] {
        let state = self.input.state;
        state.attempts.get(&row).map(Vec::as_slice).unwrap_or(&[])
    }

    fn calls(&self, row: usize) -> &[&'a Call] {
        self.by_row.get(&row).map(Vec::as_slice).unwrap_or(&[])
    }

    fn push(&mut self, invariant: &'static str, row: Option<usize>, observed: String) {
        let id = row.and_then(|r| self.id(r));
        self.out.push(Violation {
            invariant,
            row,
            id,
            observed,
        });
    }

    /// True when an earlier row of the row's ordering key is dead (`failed` or `unknown`).
    fn blocked(&self, row: &RowPlan) -> bool {
        let Some((key, position)) = &row.ordering else {
            return false;
        };
        self.keys.get(key.as_str()).is_some_and(|rows| {
            rows.iter()
                .filter(|r| r.ordering.as_ref().is_some_and(|(_, p)| p < position))
                .any(|r| matches!(self.status(r.index), "failed" | "unknown"))
        })
    }

    /// For a pending ordered row: the earliest earlier row of its key still in the outbox.
    fn waiting_behind(&self, row: &RowPlan) -> String {
        let Some((key, position)) = &row.ordering else {
            return String::new();
        };
        let head = self.keys.get(key.as_str()).and_then(|rows| {
            rows.iter().find(|r| {
                r.ordering.as_ref().is_some_and(|(_, p)| p < position)
                    && self.input.state.hot.contains_key(&r.index)
            })
        });
        match head {
            Some(head) => format!(
                " (waits behind row {} of {key}, itself {})",
                head.index,
                self.status(head.index)
            ),
            None => format!(" ({key}, nothing before it)"),
        }
    }
}

/// Checks every invariant; returns the violations and the figures.
pub fn check(input: &Inputs<'_>) -> (Vec<Violation>, Figures) {
    let mut ctx = Ctx::new(input);
    let mut figures = Figures {
        calls: input.calls.len(),
        ..Figures::default()
    };
    let mut per_row_calls = Vec::new();
    for row in &input.plan.rows {
        per_row_calls.push(ctx.calls(row.index).len());
        let state = ctx.check_row(row);
        *figures.states.entry(state).or_default() += 1;
    }
    ctx.check_requests();
    ctx.check_ordering();
    ctx.check_exits();
    per_row_calls.sort_unstable();
    figures.max_calls = per_row_calls.last().copied().unwrap_or(0);
    if !per_row_calls.is_empty() {
        let at = ((per_row_calls.len() as f64) * 0.99).ceil() as usize;
        figures.p99_calls = per_row_calls[at.clamp(1, per_row_calls.len()) - 1];
    }
    (ctx.out, figures)
}

impl Ctx<'_> {
    /// All or none of the effects of a request whose commit's answer was lost.
    fn check_requests(&mut self) {
        let mut requests: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for (row, expect) in self.input.expect {
            if let (Some(request), Committed::Maybe) = (expect.request, expect.committed) {
                let copies = self.input.state.copies.get(row).map_or(0, BTreeSet::len);
                requests.entry(request).or_default().push((*row, copies));
            }
        }
        for (request, mut rows) in requests {
            rows.sort_unstable();
            let written = rows.iter().filter(|(_, n)| *n > 0).count();
            if written != 0 && written != rows.len() {
                let list: Vec<String> = rows
                    .iter()
                    .map(|(row, n)| format!("row {row}: {n}"))
                    .collect();
                self.push(
                    "effects-exact",
                    Some(rows[0].0),
                    format!(
                        "request {request} (commit answer lost) has {written} of its {} effects \
                         in the outbox ({})",
                        rows.len(),
                        list.join(", ")
                    ),
                );
            }
        }
    }

    /// Ordering keys: every call of a row comes after every call of the rows before it ended.
    fn check_ordering(&mut self) {
        let mut names: Vec<&str> = self.keys.keys().copied().collect();
        names.sort_unstable();
        for key in names {
            let mut before_end = Duration::ZERO;
            let mut before_row = None;
            let rows = self.keys[key].clone();
            for row in rows {
                let calls = self.calls(row.index);
                let first = calls.iter().map(|c| c.start).min();
                let last = calls.iter().map(|c| end_of(c)).max();
                if let Some(first) = first.filter(|f| *f < before_end) {
                    let observed = format!(
                        "{key} position {}: called at {:.3} s, before a call of row {} (earlier \
                         in the key) ended at {:.3} s",
                        row.ordering.as_ref().map(|(_, p)| *p).unwrap_or(0),
                        first.as_secs_f64(),
                        before_row.unwrap_or(0),
                        secs(before_end)
                    );
                    self.push("ordering", Some(row.index), observed);
                }
                if let Some(last) = last.filter(|l| *l > before_end) {
                    before_end = last;
                    before_row = Some(row.index);
                }
            }
        }
    }

    /// Every relay exits 0 within grace + 5 s of its SIGTERM, and never unasked.
    fn check_exits(&mut self) {
        let limit = self.input.grace + Duration::from_secs(5);
        for exit in self.input.exits {
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
                let observed = format!("relay {} {observed}{tail}", exit.owner);
                self.push("relay-exit", None, observed);
            }
        }
    }
}

fn end_of(c: &Call) -> Duration {
    c.end.unwrap_or(Duration::MAX)
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

#[cfg(test)]
mod tests;
