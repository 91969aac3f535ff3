//! The write path's part of the plan: requests as services make them, through
//! `txoutbox::begin` (or a `BusinessKey`), each writing some of the plan's rows as its effects.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use super::RowPlan;

/// The window of the short scopes: a request with the same key this long after its
/// predecessor's claim takes the key over.
pub const SHORT_WINDOW: Duration = Duration::from_millis(20);

/// How a request's key is kept, and where its effects wait: one scope each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keying {
    /// A key row with a 24 h window; effects written as rows at commit.
    Rows,
    /// A key row with a 24 h window; effects carried by the key row until the relay fans them
    /// out (`Scope::with_deferred_effects`).
    Deferred,
    /// [`Keying::Rows`] with [`SHORT_WINDOW`].
    ShortRows,
    /// [`Keying::Deferred`] with [`SHORT_WINDOW`].
    ShortDeferred,
    /// The business row as the key record (`BusinessKey`): no window.
    Business,
}

impl Keying {
    /// The scope's name.
    pub fn scope(self) -> &'static str {
        match self {
            Keying::Rows => "soak-rows",
            Keying::Deferred => "soak-deferred",
            Keying::ShortRows => "soak-short-rows",
            Keying::ShortDeferred => "soak-short-deferred",
            Keying::Business => "soak-business",
        }
    }

    /// True for the scopes with [`SHORT_WINDOW`].
    pub fn short(self) -> bool {
        matches!(self, Keying::ShortRows | Keying::ShortDeferred)
    }

    /// True for the scopes with deferred effects.
    pub fn deferred(self) -> bool {
        matches!(self, Keying::Deferred | Keying::ShortDeferred)
    }
}

/// How a request with a key row stores its key and commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// `Claim::complete`, then the transaction's commit.
    Complete,
    /// `Claim::commit`: the key, the response, the effects and the COMMIT in one round trip.
    Commit,
}

/// The request's transaction isolation level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// READ COMMITTED.
    ReadCommitted,
    /// REPEATABLE READ.
    RepeatableRead,
    /// SERIALIZABLE.
    Serializable,
}

/// What the client does once its request has committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duplicate {
    /// Nothing.
    None,
    /// Sends it again, same key and body: the stored response must answer.
    SameBody,
    /// Sends another body with the same key: a mismatch must answer.
    OtherBody,
}

/// One request.
#[derive(Debug, Clone)]
pub struct RequestPlan {
    /// Its number.
    pub index: usize,
    /// When it is sent (a take-over: when its predecessor is).
    pub at: Duration,
    /// Its scope.
    pub keying: Keying,
    /// How it commits.
    pub path: Path,
    /// Its isolation level.
    pub isolation: Isolation,
    /// Its idempotency key.
    pub key: String,
    /// The rows it writes, in order: its effects `e0`, `e1`, ...
    pub effects: Vec<usize>,
    /// What the client sends again once it committed.
    pub duplicate: Duplicate,
    /// The request whose key this one reuses once its window has passed (a take-over).
    pub takes_over: Option<usize>,
    /// The request that reuses this one's key once its window has passed.
    pub taken_over_by: Option<usize>,
}

/// The effect name of a request's `n`-th effect.
pub fn effect_name(n: usize) -> String {
    format!("e{n}")
}

/// Makes about 60 % of the rows that are not in an ordering key (nor undecodable) effects of
/// requests, 1 to 3 a request; about 70 % of the requests in a short scope are followed by a
/// take-over of their key (itself followed by another at half the chance, up to three).
/// Returns the requests; the rows are marked with theirs.
pub(super) fn draw(rng: &mut StdRng, seed: u64, rows: &mut [RowPlan]) -> Vec<RequestPlan> {
    let mut candidates: Vec<usize> = rows
        .iter()
        .filter(|r| r.ordering.is_none() && !r.undecodable)
        .map(|r| r.index)
        .filter(|_| rng.random_bool(0.6))
        .collect();
    candidates.reverse();
    let mut requests: Vec<RequestPlan> = Vec::new();
    while !candidates.is_empty() {
        let keying = match rng.random_range(0..100) {
            0..15 => Keying::Rows,
            15..35 => Keying::Deferred,
            35..50 => Keying::ShortRows,
            50..85 => Keying::ShortDeferred,
            _ => Keying::Business,
        };
        let index = requests.len();
        let key = format!("soak-{seed}-request-{index:05}");
        requests.push(one(rng, rows, &mut candidates, index, keying, key));
        // Take-overs: the key reused once its window has passed, up to three times in a row.
        let mut chance = 0.7;
        while keying.short() && !candidates.is_empty() && rng.random_bool(chance) {
            let before = requests.len() - 1;
            let key = requests[before].key.clone();
            let mut follower = one(rng, rows, &mut candidates, before + 1, keying, key);
            follower.at = requests[before].at;
            follower.takes_over = Some(before);
            requests[before].taken_over_by = Some(before + 1);
            requests.push(follower);
            chance /= 2.0;
        }
    }
    requests
}

fn one(
    rng: &mut StdRng,
    rows: &mut [RowPlan],
    candidates: &mut Vec<usize>,
    index: usize,
    keying: Keying,
    key: String,
) -> RequestPlan {
    let n = rng.random_range(1..=3).min(candidates.len());
    let effects: Vec<usize> = (0..n).filter_map(|_| candidates.pop()).collect();
    let at = effects
        .iter()
        .map(|&r| rows[r].enqueue_at)
        .min()
        .unwrap_or_default();
    for &r in &effects {
        rows[r].request = Some(index);
        rows[r].enqueue_at = at;
    }
    let path = if keying == Keying::Business || rng.random_bool(0.5) {
        Path::Complete
    } else {
        Path::Commit
    };
    let isolation = match rng.random_range(0..3) {
        0 => Isolation::ReadCommitted,
        1 => Isolation::RepeatableRead,
        _ => Isolation::Serializable,
    };
    let duplicate = match (keying.short(), rng.random_range(0..10)) {
        (true, _) | (false, 0..5) => Duplicate::None,
        (false, 5..8) => Duplicate::SameBody,
        (false, _) => Duplicate::OtherBody,
    };
    RequestPlan {
        index,
        at,
        keying,
        path,
        isolation,
        key,
        effects,
        duplicate,
        takes_over: None,
        taken_over_by: None,
    }
}
