//! The checks of one row: its place in the outbox, its final state, its calls.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{answers, end_of, outcomes, secs, shorten, Committed, Ctx};
use crate::soak::downstream::Call;
use crate::soak::plan::RowPlan;

impl Ctx<'_> {
    /// Checks one row; returns its final state for the figures.
    pub(super) fn check_row(&mut self, row: &RowPlan) -> String {
        let i = row.index;
        let state = self.input.state;
        let copies = state.copies.get(&i).map_or(0, BTreeSet::len);
        let committed = self.input.expect.get(&i).map(|e| e.committed);
        let calls = self.calls(i).len();
        match committed {
            None | Some(Committed::No) if copies > 0 => self.push(
                "effects-exact",
                Some(i),
                format!("in the outbox {copies} times, though nothing that wrote it committed"),
            ),
            Some(Committed::Yes) if copies == 0 => {
                let observed = format!(
                    "committed, yet neither in the outbox nor delivered (lost){}; {calls} calls \
                     seen",
                    self.request_of(i)
                );
                self.push("effects-exact", Some(i), observed);
            }
            _ if copies > 1 => {
                let ids: Vec<String> = state.copies[&i].iter().map(|id| id.to_string()).collect();
                self.push(
                    "effects-exact",
                    Some(i),
                    format!("in the outbox {copies} times ({})", ids.join(", ")),
                );
            }
            _ => {}
        }
        if copies == 0 {
            self.check_calls(row);
            return match committed {
                Some(Committed::Yes) => "lost".to_owned(),
                _ => "not committed (request failed)".to_owned(),
            };
        }
        let final_state = self.check_state(row);
        self.check_failed(row);
        self.check_unknown(row);
        self.check_calls(row);
        self.check_key(row);
        final_state
    }

    /// For a row a request wrote: which request, and what became of its key.
    fn request_of(&self, row: usize) -> String {
        let plan = self.input.plan;
        let Some(request) = plan.rows[row].request.and_then(|r| plan.requests.get(r)) else {
            return String::new();
        };
        let mut text = format!(
            ": effect of request {} ({}, {:?}, {:?})",
            request.index,
            request.keying.scope(),
            request.path,
            request.isolation
        );
        if let Some(next) = request.taken_over_by.and_then(|r| plan.requests.get(r)) {
            text.push_str(&format!(
                ", whose key request {} took over at {:?}",
                next.index, next.isolation
            ));
        }
        text
    }

    /// Settled, not leased, a reason for every dead row.
    fn check_state(&mut self, row: &RowPlan) -> String {
        let i = row.index;
        let calls = self.calls(i).len();
        let Some(h) = self.input.state.hot.get(&i) else {
            return "delivered".to_owned();
        };
        match h.status.as_str() {
            "pending" if self.blocked(row) => {
                return "pending behind a dead-lettered head".to_owned();
            }
            "pending" => {
                let observed = format!(
                    "still pending after the settle deadline{}: {} attempts, next attempt {}, \
                     {calls} calls seen, last error: {}",
                    self.waiting_behind(row),
                    h.attempts,
                    if h.due_in > 0.0 {
                        format!("in {:.0} s", h.due_in)
                    } else {
                        format!("overdue by {:.0} s", -h.due_in)
                    },
                    shorten(h.last_error.as_deref())
                );
                self.push("settled", Some(i), observed);
            }
            "in_flight" => {
                let owner = h.lease_owner.as_deref().unwrap_or("?");
                let observed = format!(
                    "in_flight after every relay stopped, leased by {owner} ({}), {} attempts, \
                     last error: {}",
                    if self.input.killed.contains(owner) {
                        "SIGKILLed"
                    } else {
                        "stopped by SIGTERM"
                    },
                    h.attempts,
                    shorten(h.last_error.as_deref())
                );
                self.push("not-leased", Some(i), observed);
            }
            status => {
                if h.last_error.as_deref().is_none_or(|e| e.trim().is_empty()) {
                    self.push("reason", Some(i), format!("{status} without a last_error"));
                }
            }
        }
        h.status.clone()
    }

    /// A failed row failed for a reason the plan explains: a permanent answer (a poisoned row the
    /// downstream refused with 422), an exhausted budget, or a payload that cannot be decoded.
    fn check_failed(&mut self, row: &RowPlan) {
        let i = row.index;
        let Some(h) = self
            .input
            .state
            .hot
            .get(&i)
            .filter(|h| h.status == "failed")
        else {
            return;
        };
        let calls = self.calls(i);
        let refused = row.poisoned && calls.iter().any(|c| c.answer == "422");
        let exhausted = h.attempts >= i32::try_from(self.input.max_attempts).unwrap_or(i32::MAX);
        if refused || exhausted || row.undecodable {
            return;
        }
        let observed = format!(
            "failed after {} of {} attempts, though the row is {}; answers: {}; last error: {}",
            h.attempts,
            self.input.max_attempts,
            if row.poisoned {
                "poisoned but was never refused with 422"
            } else {
                "neither poisoned nor undecodable"
            },
            answers(calls),
            shorten(h.last_error.as_deref())
        );
        self.push("failed-explained", Some(i), observed);
    }

    /// `unknown` only for at-most-once rows, and only where a call was started (or a relay
    /// holding the row was SIGKILLed, after it recorded the start).
    fn check_unknown(&mut self, row: &RowPlan) {
        let i = row.index;
        if self.status(i) != "unknown" {
            return;
        }
        let attempts = self.attempts(i);
        if !row.at_most_once() {
            let observed = format!(
                "unknown, but the row's destination is at-least-once ({})",
                outcomes(attempts)
            );
            self.push("unknown-called", Some(i), observed);
            return;
        }
        let calls = self.calls(i).len();
        let unexempt = attempts
            .iter()
            .filter(|a| a.outcome == "unknown" && !self.input.killed.contains(&a.relay))
            .count();
        if unexempt > calls {
            let observed = format!(
                "{unexempt} unknown outcomes by relays that were not SIGKILLed, but the \
                 downstream saw {calls} calls ({})",
                outcomes(attempts)
            );
            self.push("unknown-called", Some(i), observed);
        }
    }

    /// Calls logged, bounded, one at a time; at most once where promised; a delivered row
    /// accepted.
    fn check_calls(&mut self, row: &RowPlan) {
        let i = row.index;
        let calls: Vec<&Call> = self.calls(i).to_vec();
        let attempts = self.attempts(i);
        let logged = attempts.iter().filter(|a| a.relay != "operator").count();
        let replays = attempts.iter().filter(|a| a.outcome == "replayed").count();
        let applied = calls.iter().filter(|c| c.applied).count();
        if calls.len() > logged {
            let observed = format!(
                "the downstream saw {} calls, txoutbox_attempts logs {logged} relay attempts ({})",
                calls.len(),
                outcomes(attempts)
            );
            self.push("calls-logged", Some(i), observed);
        }
        let max = self.input.max_attempts as usize;
        let allowed = max * (1 + replays);
        if calls.len() > allowed {
            let observed = format!(
                "{} calls, at most {allowed} allowed ({max} attempts x {} generations); \
                 answers: {}",
                calls.len(),
                1 + replays,
                answers(&calls)
            );
            self.push("calls-bounded", Some(i), observed);
        }
        let mut sorted = calls.clone();
        sorted.sort_by_key(|c| c.start);
        let mut open_until = Duration::ZERO;
        for c in &sorted {
            if c.start < open_until {
                let observed = format!(
                    "a call arrived at {:.3} s while an earlier call was open until {:.3} s",
                    c.start.as_secs_f64(),
                    secs(open_until)
                );
                self.push("one-call-at-a-time", Some(i), observed);
                break;
            }
            open_until = open_until.max(end_of(c));
        }
        if row.at_most_once() && applied > 1 {
            let observed = format!(
                "the effect happened {applied} times; answers: {}",
                answers(&calls)
            );
            self.push("at-most-once", Some(i), observed);
        }
        if self.status(i) == "delivered" && applied == 0 {
            let observed = format!(
                "delivered, but the downstream never accepted it; answers: {}",
                answers(&calls)
            );
            self.push("delivered-accepted", Some(i), observed);
        }
    }

    /// Every call carries the row's stored downstream key, and that key is the one its writer
    /// gave or derived by the documented rule.
    fn check_key(&mut self, row: &RowPlan) {
        let i = row.index;
        let state = self.input.state;
        let stored = match (state.hot.get(&i), state.delivered.get(&i)) {
            (Some(h), _) => h.downstream_key.clone(),
            (None, Some(d)) => d.downstream_key.clone(),
            (None, None) => return,
        };
        let expected = self.input.expect.get(&i).and_then(|e| e.key.clone());
        if let Some(expected) = expected.filter(|e| *e != stored) {
            let observed = format!(
                "the row carries downstream key {stored:?}, but its writer derived {expected:?}"
            );
            self.push("downstream-key", Some(i), observed);
        }
        let calls = self.calls(i);
        let wrong: Vec<(usize, String)> = calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.webhook_id != stored)
            .map(|(n, c)| (n + 1, c.webhook_id.clone()))
            .collect();
        if let Some((n, key)) = wrong.first() {
            let observed = format!(
                "{} of {} calls carried another webhook-id than the row's {stored:?} (call {n}: \
                 {key:?})",
                wrong.len(),
                calls.len()
            );
            self.push("downstream-key", Some(i), observed);
        }
    }
}
