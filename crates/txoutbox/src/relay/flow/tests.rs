use super::shared::humanize;
use super::*;
use crate::relay::Breaker;

const FAIL: Signal = Signal::Failed;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap_or_default()
}

#[test]
fn the_breaker_opens_at_the_threshold_and_not_before() {
    let policy = Breaker::default();
    let nine = BreakerColumns::closed().apply(&[FAIL; 9], Some(&policy), at(0));
    assert_eq!((nine.breaker, nine.failures), ("closed", 9));
    let ten = nine.apply(&[FAIL], Some(&policy), at(1));
    assert_eq!(ten.breaker, "open");
    assert_eq!(ten.opens, 1);
    assert_eq!(ten.open_until, Some(at(6)), "the first cool-down: 5 s");
    assert!(ten
        .open_reason
        .as_deref()
        .unwrap_or("")
        .contains("10 consecutive failures"));
}

#[test]
fn a_delivery_resets_the_count_and_closes() {
    let policy = Breaker::default();
    let s = BreakerColumns::closed().apply(
        &[FAIL, FAIL, FAIL, Signal::Delivered, FAIL],
        Some(&policy),
        at(0),
    );
    assert_eq!((s.breaker, s.failures), ("closed", 1));
    let half = BreakerColumns {
        breaker: "half_open",
        opens: 2,
        probe_until: Some(at(30)),
        ..BreakerColumns::closed()
    };
    assert_eq!(
        half.apply(&[Signal::Delivered], Some(&policy), at(1)),
        BreakerColumns::closed()
    );
}

#[test]
fn a_refused_row_frees_a_probe_and_says_nothing_else() {
    let policy = Breaker::default();
    let half = BreakerColumns {
        breaker: "half_open",
        failures: 10,
        opens: 1,
        open_reason: Some("10 consecutive failures; next probe in 5s".into()),
        probe_until: Some(at(30)),
        ..BreakerColumns::closed()
    };
    let after = half
        .clone()
        .apply(&[Signal::Inconclusive], Some(&policy), at(1));
    assert_eq!(
        after,
        BreakerColumns {
            probe_until: None,
            ..half
        },
        "the probe is free at once; the breaker neither closes nor counts"
    );
    let counting = BreakerColumns {
        failures: 4,
        ..BreakerColumns::closed()
    };
    assert_eq!(
        counting
            .clone()
            .apply(&[Signal::Inconclusive], Some(&policy), at(1)),
        counting,
        "a refused row neither resets nor adds to a closed breaker's count"
    );
}

#[test]
fn a_failed_probe_opens_again_for_twice_as_long_up_to_the_cap() {
    let policy = Breaker {
        failures: 3,
        cool_down: Duration::from_secs(5),
        max_cool_down: Duration::from_secs(12),
    };
    let half = BreakerColumns {
        breaker: "half_open",
        failures: 3,
        opens: 1,
        ..BreakerColumns::closed()
    };
    let again = half.apply(&[FAIL], Some(&policy), at(0));
    assert_eq!((again.breaker, again.opens), ("open", 2));
    assert_eq!(again.open_until, Some(at(10)));
    let third = BreakerColumns {
        breaker: "half_open",
        ..again
    }
    .apply(&[FAIL], Some(&policy), at(20));
    assert_eq!(
        third.open_until,
        Some(at(32)),
        "20 s doubled, capped at 12 s"
    );
    // Late failures of calls already out while open change nothing but the count.
    let late = third.clone().apply(&[FAIL, FAIL], Some(&policy), at(21));
    assert_eq!(late.open_until, third.open_until);
}

const CAP: Duration = Duration::from_secs(60);

/// Feeds `flow` answers of `destination`: `Some(wait)` throttled, `None` delivered; returns the
/// signals that tipped the window.
fn answers(flow: &Flow, destination: &str, answers: &[Option<u64>]) -> Vec<Signal> {
    answers
        .iter()
        .filter_map(|a| {
            let wait = a.map(Duration::from_secs);
            flow.answered(destination, wait, wait.is_none(), CAP, 64)
        })
        .collect()
}

#[test]
fn a_few_rows_asking_to_wait_among_deliveries_do_not_pause_the_destination() {
    let flow = Flow::default();
    let mut mix = Vec::new();
    for _ in 0..10 {
        mix.extend([None, None, Some(2)]);
    }
    assert_eq!(
        answers(&flow, "webhook", &mix),
        vec![],
        "10 of 30 asked to wait"
    );
    assert_eq!(
        answers(&flow, "quiet", &[Some(2), Some(2), Some(2), Some(2)]),
        vec![],
        "four answers are too few to judge the downstream by"
    );
}

#[test]
fn most_answers_asking_to_wait_pause_the_destination_for_the_longest_wait_up_to_the_cap() {
    let flow = Flow::default();
    let tipped = answers(
        &flow,
        "webhook",
        &[None, Some(1), Some(3), None, Some(2), Some(1), Some(1)],
    );
    assert_eq!(
        tipped,
        vec![Signal::Throttle {
            wait: Duration::from_secs(3),
            throttled: 5,
            answers: 7
        }]
    );
    // Held here at once; answers of calls that left before the hold are not counted.
    assert!(answers(&flow, "webhook", &[Some(1); 10]).is_empty());
    let other = Flow::default();
    let capped = answers(&other, "webhook", &[Some(10_000_000_000_000); 5]);
    assert_eq!(
        capped,
        vec![Signal::Throttle {
            wait: CAP,
            throttled: 5,
            answers: 5
        }]
    );
}

#[test]
fn after_a_throttle_the_ramp_starts_at_two_calls_and_grows_with_each_delivery() {
    let flow = Flow::default();
    let ramp = |flow: &Flow| {
        flow.local
            .lock()
            .ok()
            .and_then(|l| l.ramp.get("webhook").copied())
    };
    assert_eq!(ramp(&flow), None, "no ramp before a throttle");
    let _ = answers(&flow, "webhook", &[Some(1); 5]);
    assert_eq!(ramp(&flow), Some(RAMP_START));
    for _ in 0..3 {
        let _ = flow.answered("webhook", None, true, CAP, 8);
    }
    assert_eq!(ramp(&flow), Some(RAMP_START + 3));
    for _ in 0..3 {
        let _ = flow.answered("webhook", None, true, CAP, 8);
    }
    assert_eq!(ramp(&flow), None, "at the relay's limit the ramp ends");
}

#[test]
fn a_throttle_pauses_until_the_time_asked_and_leaves_the_breaker_alone() {
    let policy = Breaker::default();
    let throttle = |secs| Signal::Throttle {
        wait: Duration::from_secs(secs),
        throttled: 8,
        answers: 10,
    };
    let s = BreakerColumns::closed().apply(&[FAIL, FAIL, throttle(3)], Some(&policy), at(0));
    assert_eq!((s.breaker, s.failures), ("closed", 2));
    assert_eq!(s.throttled_until, Some(at(3)));
    assert!(s
        .throttle_reason
        .as_deref()
        .unwrap_or("")
        .contains("throttled 8 of a relay's last 10 calls and asked to wait 3s"));
    let later = s
        .clone()
        .apply(&[throttle(1), Signal::Delivered], Some(&policy), at(1));
    assert_eq!(
        later.throttled_until,
        Some(at(3)),
        "a shorter wait or a late delivery does not end it"
    );
    assert_eq!(later.failures, 0);
    assert_eq!(
        s.apply(&[throttle(5)], None, at(2)).throttled_until,
        Some(at(7)),
        "a longer wait extends it, breaker or none"
    );
}

#[test]
fn the_calls_of_a_rate_limited_destination_are_spaced_at_its_rate() {
    let flow = Flow::default();
    let gate = Gate {
        destination: "stripe".into(),
        state: "closed".into(),
        tokens: Some(0.5),
        rate: Some(100.0),
        open_for: None,
        failures: 0,
    };
    let next = flow.observe(&[gate], &Bounds::default(), std::iter::empty());
    assert_eq!(
        next,
        Some(Duration::from_millis(5)),
        "half a token missing at 100/s"
    );
    let long = Duration::from_secs(1);
    assert_eq!(flow.slot("stripe", long), None, "the first goes at once");
    let slots: Vec<Instant> = (0..4).filter_map(|_| flow.slot("stripe", long)).collect();
    assert_eq!(slots.len(), 4);
    for pair in slots.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            Duration::from_millis(10),
            "one every 10 ms"
        );
    }
    assert_eq!(flow.slot("email", long), None, "no rate, no pacing");
    let now = Instant::now();
    let furthest = (0..200)
        .filter_map(|_| flow.slot("stripe", Duration::from_millis(50)))
        .max()
        .unwrap_or(now);
    assert!(
        furthest <= Instant::now() + Duration::from_millis(50),
        "no slot beyond the longest wait"
    );
}

#[test]
fn durations_read_as_an_operator_writes_them() {
    assert_eq!(humanize(Duration::from_secs(5)), "5s");
    assert_eq!(humanize(Duration::from_millis(1500)), "1.5s");
    assert_eq!(humanize(Duration::from_secs(150)), "2m 30s");
    assert_eq!(humanize(Duration::from_secs(300)), "5m");
}
