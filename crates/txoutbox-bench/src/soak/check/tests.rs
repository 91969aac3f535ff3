//! The checker against hand-made ends of a run: each invariant it claims is broken once.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use uuid::Uuid;

use super::{check, Attempt, Committed, DeliveredRow, Expect, Final, HotRow, Inputs, Violation};
use crate::soak::downstream::Call;
use crate::soak::plan::{downstream_key, Plan, RowPlan, AT_LEAST_ONCE, AT_MOST_ONCE};

const MAX_ATTEMPTS: u32 = 6;

fn plan(rows: usize) -> Plan {
    Plan {
        seed: 1,
        rows: (0..rows)
            .map(|index| RowPlan {
                index,
                destination: AT_LEAST_ONCE,
                ordering: None,
                script: Vec::new(),
                poisoned: false,
                undecodable: false,
                request: None,
                enqueue_at: Duration::ZERO,
            })
            .collect(),
        requests: Vec::new(),
        events: Vec::new(),
        chaos: Duration::from_secs(1),
    }
}

fn call(row: usize, key: &str, at: u64, answer: &'static str) -> Call {
    Call {
        row,
        webhook_id: key.to_owned(),
        start: Duration::from_millis(at),
        end: Some(Duration::from_millis(at + 10)),
        answer,
        applied: answer == "200",
    }
}

fn attempts(state: &mut Final, row: usize, outcomes: &[&str]) {
    let log = outcomes
        .iter()
        .map(|o| Attempt {
            relay: "soak-r0-g0".into(),
            outcome: (*o).into(),
        })
        .collect();
    state.attempts.insert(row, log);
}

fn delivered(state: &mut Final, row: usize, key: &str) {
    let id = Uuid::new_v4();
    state.copies.entry(row).or_default().insert(id);
    let downstream_key = key.to_owned();
    state
        .delivered
        .insert(row, DeliveredRow { id, downstream_key });
}

fn hot(state: &mut Final, row: usize, status: &str, attempts: i32, error: &str) {
    let id = Uuid::new_v4();
    state.copies.entry(row).or_default().insert(id);
    let row_state = HotRow {
        id,
        status: status.into(),
        downstream_key: downstream_key(row),
        last_error: Some(error.into()),
        lease_owner: None,
        attempts,
        due_in: 0.0,
    };
    state.hot.insert(row, row_state);
}

fn committed(rows: usize) -> HashMap<usize, Expect> {
    (0..rows)
        .map(|i| {
            let expect = Expect {
                committed: Committed::Yes,
                key: Some(downstream_key(i)),
                request: None,
            };
            (i, expect)
        })
        .collect()
}

fn run(plan: &Plan, expect: &HashMap<usize, Expect>, calls: &[Call], state: &Final) -> Vec<String> {
    let killed = HashSet::new();
    let (violations, _) = check(&Inputs {
        plan,
        expect,
        max_attempts: MAX_ATTEMPTS,
        grace: Duration::from_secs(3),
        calls,
        state,
        exits: &[],
        killed: &killed,
    });
    violations.iter().map(Violation::to_string).collect()
}

/// [`run`] with every row of `plan` committed as its writer meant.
fn run_committed(plan: &Plan, calls: &[Call], state: &Final) -> Vec<String> {
    run(plan, &committed(plan.rows.len()), calls, state)
}

fn only(violations: &[String], invariant: &str) {
    assert!(!violations.is_empty(), "no violation, {invariant} expected");
    for v in violations {
        assert!(v.starts_with(&format!("[{invariant}]")), "{v}");
    }
}

#[test]
fn a_call_that_carries_another_key_than_its_row_is_a_violation() {
    let plan = plan(2);
    let mut state = Final::default();
    delivered(&mut state, 0, "soak-0");
    delivered(&mut state, 1, "soak-1");
    attempts(&mut state, 0, &["retry", "delivered"]);
    attempts(&mut state, 1, &["retry", "delivered"]);
    let clean = [
        call(0, "soak-0", 0, "500"),
        call(0, "soak-0", 100, "200"),
        call(1, "soak-1", 0, "500"),
        call(1, "soak-1", 100, "200"),
    ];
    assert_eq!(run_committed(&plan, &clean, &state), Vec::<String>::new());
    let mut per_attempt = clean.clone();
    per_attempt[3].webhook_id = "soak-1-2".into();
    only(
        &run_committed(&plan, &per_attempt, &state),
        "downstream-key",
    );
}

#[test]
fn a_row_that_carries_another_key_than_its_writer_derived_is_a_violation() {
    let plan = plan(1);
    let mut state = Final::default();
    delivered(&mut state, 0, "6d2d3a3c-0000-5000-8000-000000000000");
    attempts(&mut state, 0, &["delivered"]);
    let calls = [call(0, "6d2d3a3c-0000-5000-8000-000000000000", 0, "200")];
    only(&run_committed(&plan, &calls, &state), "downstream-key");
}

#[test]
fn a_failed_row_needs_a_reason_the_plan_explains() {
    let mut plan = plan(3);
    plan.rows[1].poisoned = true;
    plan.rows[2].undecodable = true;
    let mut state = Final::default();
    hot(&mut state, 0, "failed", 1, "the receiver answered 500");
    hot(&mut state, 1, "failed", 1, "the receiver answered 422");
    hot(&mut state, 2, "failed", 0, "the payload cannot be decoded");
    attempts(&mut state, 0, &["failed"]);
    attempts(&mut state, 1, &["failed"]);
    let calls = [call(0, "soak-0", 0, "500"), call(1, "soak-1", 0, "422")];
    let violations = run_committed(&plan, &calls, &state);
    only(&violations, "failed-explained");
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].starts_with("[failed-explained] row 0"));
    // The same row, dead-lettered once its budget was spent.
    state.hot.get_mut(&0).expect("row 0").attempts = MAX_ATTEMPTS as i32;
    assert_eq!(run_committed(&plan, &calls, &state), Vec::<String>::new());
}

#[test]
fn a_poisoned_row_failed_without_a_refusal_is_a_violation() {
    let mut plan = plan(1);
    plan.rows[0].poisoned = true;
    let mut state = Final::default();
    hot(&mut state, 0, "failed", 1, "the receiver answered 500");
    attempts(&mut state, 0, &["failed"]);
    let calls = [call(0, "soak-0", 0, "500")];
    only(&run_committed(&plan, &calls, &state), "failed-explained");
}

#[test]
fn effects_lost_doubled_or_written_without_a_commit_are_violations() {
    let plan = plan(6);
    let mut expect = committed(6);
    let mut state = Final::default();
    // Row 0 committed but absent; row 1 twice; row 2 uncommitted but present.
    delivered(&mut state, 1, "soak-1");
    state.copies.entry(1).or_default().insert(Uuid::new_v4());
    expect.get_mut(&2).expect("row 2").committed = Committed::No;
    delivered(&mut state, 2, "soak-2");
    // Rows 3 and 4: one request whose commit answer was lost, half written; row 5 alone, none.
    for i in [3, 4, 5] {
        let e = expect.get_mut(&i).expect("row");
        e.committed = Committed::Maybe;
        e.request = Some(if i == 5 { 2 } else { 1 });
    }
    delivered(&mut state, 3, "soak-3");
    for i in [1, 2, 3] {
        attempts(&mut state, i, &["delivered"]);
    }
    let calls = [
        call(1, "soak-1", 0, "200"),
        call(2, "soak-2", 0, "200"),
        call(3, "soak-3", 0, "200"),
    ];
    let violations = run(&plan, &expect, &calls, &state);
    only(&violations, "effects-exact");
    let rows: Vec<&str> = violations
        .iter()
        .map(|v| v.split(' ').nth(2).unwrap_or("").trim_end_matches(':'))
        .collect();
    assert_eq!(rows, ["0", "1", "2", "3"], "{violations:?}");
}

#[test]
fn unknown_is_for_at_most_once_rows_whose_call_started() {
    let mut plan = plan(3);
    for row in &mut plan.rows[1..] {
        row.destination = AT_MOST_ONCE;
    }
    let mut state = Final::default();
    for i in 0..3 {
        hot(&mut state, i, "unknown", 1, "timed out");
        attempts(&mut state, i, &["unknown"]);
    }
    // Row 0: at-least-once; row 1: called; row 2: never called.
    let calls = [call(0, "soak-0", 0, "reset"), call(1, "soak-1", 0, "reset")];
    let violations = run_committed(&plan, &calls, &state);
    only(&violations, "unknown-called");
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(violations[0].starts_with("[unknown-called] row 0"));
    assert!(violations[1].starts_with("[unknown-called] row 2"));
}
