//! The fault plan: everything the soak will do, drawn from one seed before anything runs, so a
//! seed names a run. Per row: its destination, its ordering key, and the downstream's script of
//! answers for its calls. Over time: signals to relays, a Postgres restart, 429 storms, and the
//! operator's `replay` and `purge` beside the relays.

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub mod requests;

pub use requests::RequestPlan;

/// The at-least-once webhook destination (its receiver deduplicates on `webhook-id`).
pub const AT_LEAST_ONCE: &str = "webhook:alo";
/// The at-most-once webhook destination (its receiver cannot deduplicate).
pub const AT_MOST_ONCE: &str = "webhook:amo";

/// The downstream key of row `index` (the soak's own, so the checker can map rows without ids).
pub fn downstream_key(index: usize) -> String {
    format!("soak-{index}")
}

/// How the downstream answers one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 200 at once.
    Ok,
    /// 200 after this many milliseconds (within the sink's timeout).
    Slow(u64),
    /// 200 after the lease has run out (the sink's timeout cuts it off first).
    SlowerThanLease,
    /// Reads the request and never answers, until the caller hangs up (at most a minute).
    Hang,
    /// 500 with a body of this kind.
    ServerError(Body),
    /// 429 (or 503) with a `Retry-After` of this kind.
    RetryAfter(RetryAfter, u16),
    /// Reads the request, then resets the connection (RST) without answering.
    Reset,
    /// Accepts the request (the effect happens), then closes the connection without answering.
    AcceptedThenDropped,
    /// 422: a permanent refusal.
    Poison,
}

/// The body of a 500 answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Text with NUL bytes in it.
    Nul,
    /// Random bytes (invalid UTF-8, NULs, control characters).
    Binary,
    /// Four megabytes.
    Huge,
    /// A short plain-text error.
    Text,
}

/// A `Retry-After` header value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// `10000000000000` seconds.
    Huge,
    /// `-5`.
    Negative,
    /// Not a number nor a date.
    Garbage,
    /// `1`.
    Small,
}

impl Answer {
    /// The fault's name in the report (`None` for a plain 200).
    pub fn fault(self) -> Option<&'static str> {
        Some(match self {
            Answer::Ok => return None,
            Answer::Slow(_) => "slow answer (within the timeout)",
            Answer::SlowerThanLease => "answer slower than the lease",
            Answer::Hang => "hang",
            Answer::ServerError(Body::Nul) => "500 with NUL bytes in the body",
            Answer::ServerError(Body::Binary) => "500 with a binary body",
            Answer::ServerError(Body::Huge) => "500 with a 4 MB body",
            Answer::ServerError(Body::Text) => "500",
            Answer::RetryAfter(RetryAfter::Huge, _) => "Retry-After: 10000000000000",
            Answer::RetryAfter(RetryAfter::Negative, _) => "Retry-After: -5",
            Answer::RetryAfter(RetryAfter::Garbage, _) => "Retry-After: garbage",
            Answer::RetryAfter(RetryAfter::Small, _) => "Retry-After: 1",
            Answer::Reset => "connection reset",
            Answer::AcceptedThenDropped => "accepted, then connection dropped",
            Answer::Poison => "422 (poisoned row)",
        })
    }
}

/// One row of the plan.
#[derive(Debug, Clone)]
pub struct RowPlan {
    /// The row's number (its downstream key is `soak-<index>`).
    pub index: usize,
    /// [`AT_LEAST_ONCE`] or [`AT_MOST_ONCE`].
    pub destination: &'static str,
    /// The ordering key and the row's position in it (0 = head).
    pub ordering: Option<(String, usize)>,
    /// The downstream's answer to the row's n-th call; past the end, 200 (or 422 if poisoned).
    pub script: Vec<Answer>,
    /// Every call of this row is refused with 422.
    pub poisoned: bool,
    /// The row is stored with a payload the relay cannot decode (written with SQL).
    pub undecodable: bool,
    /// The request that writes the row as one of its effects (`None`: `txoutbox::enqueue`
    /// writes it, or SQL when it is undecodable).
    pub request: Option<usize>,
    /// When the row is enqueued, from the start of the run.
    pub enqueue_at: Duration,
}

impl RowPlan {
    /// The answer to the row's `call`-th call (0-based, storm answers not counted).
    pub fn answer(&self, call: usize) -> Answer {
        if self.poisoned {
            return Answer::Poison;
        }
        self.script.get(call).copied().unwrap_or(Answer::Ok)
    }

    /// True for rows of the at-most-once destination.
    pub fn at_most_once(&self) -> bool {
        self.destination == AT_MOST_ONCE
    }
}

/// Something done at a moment of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// SIGTERM to relay `n` (restarted once it exits).
    Sigterm(usize),
    /// SIGKILL to relay `n` (restarted at once).
    Sigkill(usize),
    /// Postgres stopped (immediate mode, like a crash) and started again.
    PostgresRestart,
    /// Every call answers 429 (`Retry-After: 1`) for this long.
    Storm(Duration),
    /// `txoutbox replay` of failed at-least-once rows, and of unknown rows that did not happen.
    Replay,
    /// `txoutbox purge --retention 2s`.
    Purge,
}

impl EventKind {
    /// The event's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Sigterm(_) => "SIGTERM of a relay mid-run",
            EventKind::Sigkill(_) => "SIGKILL of a relay mid-run",
            EventKind::PostgresRestart => "Postgres restart",
            EventKind::Storm(_) => "429 storm",
            EventKind::Replay => "txoutbox replay beside the relays",
            EventKind::Purge => "txoutbox purge beside the relays",
        }
    }
}

/// An event and when it happens, from the start of the run.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// When.
    pub at: Duration,
    /// What.
    pub kind: EventKind,
}

/// The whole run, drawn from a seed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The seed it was drawn from.
    pub seed: u64,
    /// Every row, by index.
    pub rows: Vec<RowPlan>,
    /// The requests that write some of the rows, by index.
    pub requests: Vec<RequestPlan>,
    /// Every event, in time order.
    pub events: Vec<Event>,
    /// How long faults are injected.
    pub chaos: Duration,
}

impl Plan {
    /// Draws the plan of `rows` rows over `chaos`, for `relays` relays, from `seed`; with
    /// `hostile`, about 1 % of the rows (at least 2 of 50 or more) are stored undecodable.
    pub fn draw(seed: u64, rows: usize, relays: usize, chaos: Duration, hostile: bool) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut plans = draw_rows(&mut rng, rows, chaos);
        draw_ordering(&mut rng, &mut plans);
        if hostile {
            draw_undecodable(&mut rng, &mut plans);
        }
        let requests = requests::draw(&mut rng, seed, &mut plans);
        let events = draw_events(&mut rng, relays.max(1), chaos);
        Plan {
            seed,
            rows: plans,
            requests,
            events,
            chaos,
        }
    }

    /// A short fingerprint of the plan (the same seed and sizes give the same digest).
    pub fn digest(&self) -> u64 {
        // FNV-1a over the plan's debug text: stable for one build, enough to compare two runs.
        let text = format!("{:?}{:?}{:?}", self.rows, self.requests, self.events);
        text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ordered = self.rows.iter().filter(|r| r.ordering.is_some()).count();
        let keys: std::collections::BTreeSet<&str> = self
            .rows
            .iter()
            .filter_map(|r| r.ordering.as_ref().map(|(k, _)| k.as_str()))
            .collect();
        let poisoned_heads = self
            .rows
            .iter()
            .filter(|r| r.poisoned && r.ordering.as_ref().is_some_and(|(_, p)| *p == 0))
            .count();
        let at_most_once = self.rows.iter().filter(|r| r.at_most_once()).count();
        let scripted = self.rows.iter().filter(|r| !r.script.is_empty()).count();
        let undecodable = self.rows.iter().filter(|r| r.undecodable).count();
        let effects = self.rows.iter().filter(|r| r.request.is_some()).count();
        let take_overs = self
            .requests
            .iter()
            .filter(|r| r.takes_over.is_some())
            .count();
        write!(
            f,
            "{} rows ({} at-most-once, {} with scripted faults, {} in {} ordering keys, {} \
             poisoned heads, {undecodable} undecodable, {effects} written by {} requests with \
             {take_overs} take-overs), {} timed events over {:?}; plan digest {:016x}",
            self.rows.len(),
            at_most_once,
            scripted,
            ordered,
            keys.len(),
            poisoned_heads,
            self.requests.len(),
            self.events.len(),
            self.chaos,
            self.digest()
        )
    }
}

/// Every row's destination, script and time; rows arrive over the first 70 % of the run, so
/// faults meet rows in every state.
fn draw_rows(rng: &mut StdRng, rows: usize, chaos: Duration) -> Vec<RowPlan> {
    let window = chaos.mul_f64(0.7).as_millis().max(1) as u64;
    (0..rows)
        .map(|index| {
            let destination = if rng.random_bool(0.2) {
                AT_MOST_ONCE
            } else {
                AT_LEAST_ONCE
            };
            let script = if rng.random_bool(0.45) {
                Vec::new()
            } else {
                let n = rng.random_range(1..=3);
                (0..n).map(|_| draw_fault(rng)).collect()
            };
            RowPlan {
                index,
                destination,
                ordering: None,
                script,
                poisoned: rng.random_bool(0.01),
                undecodable: false,
                request: None,
                enqueue_at: Duration::from_millis(rng.random_range(0..window)),
            }
        })
        .collect()
}

/// Ordering keys: groups of 3..=6 at-least-once rows; about one group in five has a poisoned
/// head (the rows behind it wait for an operator).
fn draw_ordering(rng: &mut StdRng, plans: &mut [RowPlan]) {
    let mut candidates: Vec<usize> = plans
        .iter()
        .filter(|p| p.destination == AT_LEAST_ONCE && rng.random_bool(0.4))
        .map(|p| p.index)
        .collect();
    let mut group = 0;
    while candidates.len() >= 3 {
        let size = rng.random_range(3..=6).min(candidates.len());
        let members: Vec<usize> = candidates.drain(..size).collect();
        let key = format!("order-{group}");
        let poisoned_head = group % 5 == 2 || rng.random_bool(0.1);
        let mut times: Vec<Duration> = members.iter().map(|&i| plans[i].enqueue_at).collect();
        times.sort();
        for (position, (&i, at)) in members.iter().zip(times).enumerate() {
            let row = &mut plans[i];
            row.ordering = Some((key.clone(), position));
            row.enqueue_at = at;
            row.poisoned = position == 0 && poisoned_head;
        }
        group += 1;
    }
}

/// Undecodable rows: about 1 % of the rows outside ordering keys (at least 2 when there are 50
/// rows or more), each with a plain script (whatever delivers or dead-letters it is the
/// relay's doing).
fn draw_undecodable(rng: &mut StdRng, plans: &mut [RowPlan]) {
    let free: Vec<usize> = plans
        .iter()
        .filter(|p| p.ordering.is_none())
        .map(|p| p.index)
        .collect();
    let want = (plans.len() / 100).max(if plans.len() >= 50 { 2 } else { 0 });
    for _ in 0..want.min(free.len()) {
        let i = free[rng.random_range(0..free.len())];
        let row = &mut plans[i];
        row.undecodable = true;
        row.poisoned = false;
        row.script.clear();
    }
}

/// Draws one event's kind, for `relays` relays.
type DrawEvent = fn(&mut StdRng, usize) -> EventKind;

/// The timed events, in time order.
fn draw_events(rng: &mut StdRng, relays: usize, chaos: Duration) -> Vec<Event> {
    let secs = chaos.as_secs_f64();
    let count = |per: f64| ((secs / per).round() as usize).max(1);
    let ms = chaos.as_millis().max(20) as u64;
    let kinds: [(f64, DrawEvent); 6] = [
        (20.0, |rng, relays| {
            EventKind::Sigterm(rng.random_range(0..relays))
        }),
        (25.0, |rng, relays| {
            EventKind::Sigkill(rng.random_range(0..relays))
        }),
        (150.0, |_, _| EventKind::PostgresRestart),
        (30.0, |rng, _| {
            EventKind::Storm(Duration::from_millis(rng.random_range(1000..2500)))
        }),
        (20.0, |_, _| EventKind::Replay),
        (20.0, |_, _| EventKind::Purge),
    ];
    let mut events = Vec::new();
    for (per, kind) in kinds {
        for _ in 0..count(per) {
            let kind = kind(rng, relays);
            let at = Duration::from_millis(rng.random_range(ms / 20..ms * 9 / 10));
            events.push(Event { at, kind });
        }
    }
    events.sort_by_key(|e| e.at);
    events
}

fn draw_fault(rng: &mut StdRng) -> Answer {
    match rng.random_range(0..100) {
        0..10 => Answer::Slow(rng.random_range(500..3000)),
        10..15 => Answer::SlowerThanLease,
        15..20 => Answer::Hang,
        20..28 => Answer::ServerError(Body::Nul),
        28..34 => Answer::ServerError(Body::Binary),
        34..39 => Answer::ServerError(Body::Huge),
        39..50 => Answer::ServerError(Body::Text),
        50..56 => Answer::RetryAfter(RetryAfter::Huge, 429),
        56..60 => Answer::RetryAfter(RetryAfter::Huge, 503),
        60..66 => Answer::RetryAfter(RetryAfter::Negative, 429),
        66..72 => Answer::RetryAfter(RetryAfter::Garbage, 429),
        72..78 => Answer::RetryAfter(RetryAfter::Small, 429),
        78..88 => Answer::Reset,
        _ => Answer::AcceptedThenDropped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_plan() {
        let a = Plan::draw(7, 300, 3, Duration::from_secs(60), true);
        let b = Plan::draw(7, 300, 3, Duration::from_secs(60), true);
        let c = Plan::draw(8, 300, 3, Duration::from_secs(60), true);
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
    }

    #[test]
    fn rows_of_an_ordering_key_are_enqueued_in_position_order() {
        let plan = Plan::draw(11, 500, 3, Duration::from_secs(60), true);
        let mut by_key: std::collections::HashMap<&str, Vec<(usize, Duration)>> =
            Default::default();
        for row in &plan.rows {
            if let Some((key, position)) = &row.ordering {
                by_key
                    .entry(key)
                    .or_default()
                    .push((*position, row.enqueue_at));
            }
        }
        assert!(!by_key.is_empty());
        for (_, mut rows) in by_key {
            rows.sort();
            assert!(rows.windows(2).all(|w| w[0].1 <= w[1].1));
        }
    }
}
