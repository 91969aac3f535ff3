//! The write path as services drive it: each planned request through `txoutbox::begin` (or a
//! `BusinessKey`) in a transaction of its isolation level, its effects enqueued on the claim,
//! committed with `complete` + commit or `Claim::commit`; retried as a client retries (same key,
//! same body) after an error or a lost commit answer; sent again once committed (same body: the
//! stored response must answer; another body: a mismatch); its key reused once the window has
//! passed (a take-over). What each request committed, and with which claim, is what the checker
//! expects in the outbox.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use deadpool_postgres::Pool;
use tokio_postgres::types::Type;
use tokio_postgres::IsolationLevel;
use txoutbox::idempotency::{BusinessKey, RowBegin};
use txoutbox::{Begin, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse};
use uuid::Uuid;

use super::check::{Committed, Expect, Violation};
use super::plan::requests::{effect_name, Duplicate, Isolation, Keying, Path, SHORT_WINDOW};
use super::plan::{Plan, RequestPlan};

/// The business table of [`Keying::Business`]: its rows are their requests' key records.
pub const ORDERS: &str = "CREATE TABLE soak_orders (id bigserial PRIMARY KEY, \
     idempotency_key text NOT NULL UNIQUE, request_fingerprint bytea NOT NULL)";
const ORDERS_LOOKUP: &str = "SELECT * FROM soak_orders WHERE idempotency_key = $1";
const ORDERS_INSERT: &str = "INSERT INTO soak_orders (idempotency_key, request_fingerprint) \
     VALUES ($1, $2) ON CONFLICT (idempotency_key) DO NOTHING RETURNING *";

/// The namespace of derived downstream keys, as docs/guarantees.md and the API docs state it
/// (written out here, not taken from the library, so that the checker holds the library to
/// its documented rule).
const DOCUMENTED_NAMESPACE: Uuid = Uuid::from_u128(0x6a1f_3c2e_8b4d_4e7a_9c15_2f0b_7d3e_91a4);

/// The claim's time in microseconds since the epoch: the transaction's `now()`, as a claim
/// takes it.
const NOW_MICROS: &str = "SELECT (EXTRACT(EPOCH FROM now()) * 1000000)::int8";

/// The downstream key of `effect` by the documented rule: `UUIDv5(namespace,
/// "{scope}\n{key}\n{effect}\n{claimed_at}")` for a claim of a key row, without the claim's
/// time for a business row.
pub fn documented_key(scope: &str, key: &str, effect: &str, claimed_at: Option<i64>) -> String {
    let name = match claimed_at {
        Some(micros) => format!("{scope}\n{key}\n{effect}\n{micros}"),
        None => format!("{scope}\n{key}\n{effect}"),
    };
    Uuid::new_v5(&DOCUMENTED_NAMESPACE, name.as_bytes()).to_string()
}

/// What one request committed: whether, and the claim's time (`None` for a business row).
#[derive(Debug, Clone, Copy)]
struct Outcome {
    committed: Committed,
    claimed_at: Option<i64>,
}

/// What the writers did, for the checker.
#[derive(Debug, Default)]
pub struct Written {
    outcomes: HashMap<usize, Outcome>,
    /// Answers the write path should not have given (a retry that ran again, a key derived
    /// against the documented rule).
    pub anomalies: Vec<Violation>,
    /// What the requests did, counted for the report.
    pub figures: BTreeMap<String, u64>,
}

impl Written {
    fn count(&mut self, what: impl Into<String>) {
        *self.figures.entry(what.into()).or_default() += 1;
    }
}

impl Written {
    /// What the checker expects of every row a request writes.
    pub fn expect(&self, plan: &Plan) -> HashMap<usize, Expect> {
        let mut expect = HashMap::new();
        for request in &plan.requests {
            let outcome = self.outcomes.get(&request.index).copied();
            let committed = outcome.map_or(Committed::No, |o| o.committed);
            for (n, &row) in request.effects.iter().enumerate() {
                let key = (committed != Committed::No).then(|| {
                    let claimed_at = outcome.and_then(|o| o.claimed_at);
                    let scope = request.keying.scope();
                    documented_key(scope, &request.key, &effect_name(n), claimed_at)
                });
                let request = Some(request.index);
                expect.insert(
                    row,
                    Expect {
                        committed,
                        key,
                        request,
                    },
                );
            }
        }
        expect
    }
}

/// How one try of a request ended.
enum Tried {
    /// Committed, claimed at this time.
    Committed(Option<i64>),
    /// The commit was sent but its answer lost: committed or not.
    Lost(Option<i64>),
    /// The stored response answered.
    Replay,
    /// The key was used for another request.
    Mismatch,
    /// Another request holds the key (or a serialization failure): try again.
    InFlight,
}

/// Sends every request at its time, at most 4 at once; a take-over is sent by its
/// predecessor's task, once the key's window has passed.
pub async fn write_all(pool: Pool, plan: Arc<Plan>, epoch: Instant) -> Result<Written> {
    let written = Arc::new(Mutex::new(Written::default()));
    let slots = Arc::new(tokio::sync::Semaphore::new(4));
    let mut order: Vec<&RequestPlan> = plan
        .requests
        .iter()
        .filter(|r| r.takes_over.is_none())
        .collect();
    order.sort_by_key(|r| (r.at, r.index));
    let mut tasks = Vec::new();
    for request in order {
        if let Some(wait) = request.at.checked_sub(epoch.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let permit = slots.clone().acquire_owned().await?;
        let (pool, plan, written) = (pool.clone(), plan.clone(), written.clone());
        let index = request.index;
        tasks.push(tokio::spawn(async move {
            let mut next = Some(index);
            while let Some(i) = next {
                let request = &plan.requests[i];
                let carried = match request.takes_over {
                    Some(_) => carries_effects(&pool, request).await,
                    None => false,
                };
                let done = run(&pool, &plan, request).await;
                if let Ok(mut w) = written.lock() {
                    w.tally(request, &done.0, carried);
                    w.outcomes.insert(i, done.0);
                    w.anomalies.extend(done.1);
                }
                next = request.taken_over_by;
                // The window runs from the claim, before the commit: once it has passed since
                // the commit, the key has expired.
                if next.is_some() {
                    tokio::time::sleep(SHORT_WINDOW + Duration::from_millis(10)).await;
                }
            }
            drop(permit);
        }));
    }
    for task in tasks {
        task.await?;
    }
    let mut written = written
        .lock()
        .map_err(|_| anyhow::anyhow!("writer panicked"))?;
    Ok(std::mem::take(&mut *written))
}

impl Written {
    /// Counts what one request did.
    fn tally(&mut self, request: &RequestPlan, outcome: &Outcome, carried: bool) {
        self.count(match outcome.committed {
            Committed::Yes => "committed",
            Committed::Maybe => "commit answer lost",
            Committed::No => "not committed",
        });
        self.count(format!("{}, {:?}", request.keying.scope(), request.path));
        if request.duplicate != Duplicate::None && outcome.committed == Committed::Yes {
            self.count(format!("sent again ({:?})", request.duplicate));
        }
        if request.takes_over.is_some() {
            self.count(format!("take-over at {:?}", request.isolation));
            if carried {
                self.count("take-over, effects not yet fanned out");
            }
        }
    }
}

/// Whether the key a take-over is about to reuse still carries its predecessor's effects (not
/// fanned out yet): the case where a take-over must keep them.
async fn carries_effects(pool: &Pool, request: &RequestPlan) -> bool {
    let Ok(client) = pool.get().await else {
        return false;
    };
    client
        .query_opt(
            "SELECT 1 FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2 \
             AND effects IS NOT NULL",
            &[&request.keying.scope(), &request.key],
        )
        .await
        .is_ok_and(|row| row.is_some())
}

/// One request, tried until it commits (or, in a short scope, until its commit answer is lost:
/// a retry could come after the window and make new effects), then sent again as planned.
async fn run(pool: &Pool, plan: &Plan, request: &RequestPlan) -> (Outcome, Vec<Violation>) {
    let mut anomalies = Vec::new();
    let mut lost = None;
    let mut outcome = Outcome {
        committed: Committed::No,
        claimed_at: None,
    };
    for _ in 0..300 {
        let tried = try_once(pool, plan, request, 0, &mut anomalies).await;
        match tried {
            Ok(Tried::Committed(claimed_at)) => {
                outcome = Outcome {
                    committed: Committed::Yes,
                    claimed_at,
                };
                break;
            }
            Ok(Tried::Lost(claimed_at)) => {
                lost = Some(claimed_at);
                if request.keying.short() {
                    break;
                }
            }
            Ok(Tried::Replay) if lost.is_some() => {
                outcome = Outcome {
                    committed: Committed::Yes,
                    claimed_at: lost.flatten(),
                };
                lost = None;
                break;
            }
            Ok(answer @ (Tried::Replay | Tried::Mismatch)) => {
                let what = if matches!(answer, Tried::Replay) {
                    "a stored response"
                } else {
                    "a mismatch"
                };
                anomalies.push(anomaly(
                    request,
                    format!("a new request was answered with {what}"),
                ));
                break;
            }
            Ok(Tried::InFlight) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    if let Some(claimed_at) = lost {
        outcome = Outcome {
            committed: Committed::Maybe,
            claimed_at,
        };
    }
    if outcome.committed == Committed::Yes && request.duplicate != Duplicate::None {
        send_again(pool, plan, request, &mut anomalies).await;
    }
    (outcome, anomalies)
}

/// The client sends the committed request again (same body) or another with its key: the
/// stored response, or a mismatch, must answer.
async fn send_again(
    pool: &Pool,
    plan: &Plan,
    request: &RequestPlan,
    anomalies: &mut Vec<Violation>,
) {
    let (variant, wanted) = match request.duplicate {
        Duplicate::SameBody => (0, "the stored response"),
        _ => (1, "a mismatch"),
    };
    for _ in 0..50 {
        let got = match try_once(pool, plan, request, variant, anomalies).await {
            Ok(Tried::Replay) if variant == 0 => return,
            Ok(Tried::Mismatch) if variant == 1 => return,
            Ok(Tried::InFlight) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Ok(Tried::Replay) => "the stored response",
            Ok(Tried::Mismatch) => "a mismatch",
            Ok(Tried::Committed(_) | Tried::Lost(_)) => {
                "a new claim, whose effects were written again"
            }
        };
        let observed = format!("sent again within its window, it got {got}, not {wanted}");
        anomalies.push(anomaly(request, observed));
        return;
    }
}

fn anomaly(request: &RequestPlan, observed: String) -> Violation {
    Violation {
        invariant: "request-answers",
        row: request.effects.first().copied(),
        id: None,
        observed: format!(
            "request {} ({} {:?} {:?} {:?}): {observed}",
            request.index,
            request.keying.scope(),
            request.path,
            request.isolation,
            request.duplicate
        ),
    }
}

/// The scope of a keying.
fn scope(keying: Keying) -> Result<Scope> {
    let mut scope = Scope::new(keying.scope())?;
    if keying.short() {
        scope = scope.with_window(SHORT_WINDOW)?;
    }
    if keying.deferred() {
        scope = scope.with_deferred_effects();
    }
    Ok(scope)
}

/// One try: a transaction of the request's isolation level, its claim, its effects, its commit.
async fn try_once(
    pool: &Pool,
    plan: &Plan,
    request: &RequestPlan,
    variant: u32,
    anomalies: &mut Vec<Violation>,
) -> Result<Tried> {
    let mut client = pool.get().await?;
    let level = match request.isolation {
        Isolation::ReadCommitted => IsolationLevel::ReadCommitted,
        Isolation::RepeatableRead => IsolationLevel::RepeatableRead,
        Isolation::Serializable => IsolationLevel::Serializable,
    };
    let tx = client
        .build_transaction()
        .isolation_level(level)
        .start()
        .await?;
    let claimed_at: i64 = tx.query_one(NOW_MICROS, &[]).await?.get(0);
    let key = IdempotencyKey::parse(&request.key)?;
    let body = format!(r#"{{"request":{},"variant":{variant}}}"#, request.index);
    let fingerprint = Fingerprint::new("POST", "/soak", body.as_bytes());
    let scope = scope(request.keying)?;
    let effects = effects(plan, request)?;
    if request.keying == Keying::Business {
        let orders = BusinessKey::new(scope, ORDERS_LOOKUP, "request_fingerprint");
        let fp: &[u8] = fingerprint.as_bytes();
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
            [(&request.key, Type::TEXT), (&fp, Type::BYTEA)];
        let mut claim = match orders
            .begin(&*tx, &key, &fingerprint, ORDERS_INSERT, &params)
            .await?
        {
            RowBegin::New { claim, .. } => claim,
            RowBegin::Replay(_) => return Ok(Tried::Replay),
            RowBegin::Mismatch => return Ok(Tried::Mismatch),
            RowBegin::InFlight => return Ok(Tried::InFlight),
        };
        for (name, message) in effects {
            claim.enqueue(&name, message)?;
        }
        claim.complete(&*tx).await?;
        return committed(tx.commit().await, None);
    }
    let mut claim = match txoutbox::begin(&tx, &scope, &key, &fingerprint).await? {
        Begin::New(claim) => claim,
        Begin::Replay(_) => return Ok(Tried::Replay),
        Begin::Mismatch => return Ok(Tried::Mismatch),
        Begin::InFlight => return Ok(Tried::InFlight),
    };
    for (name, message) in effects {
        let documented = documented_key(scope.name(), &request.key, &name, Some(claimed_at));
        if claim.downstream_key(&name) != documented {
            let observed = format!(
                "effect {name}: Claim::downstream_key says {:?}, the documented rule {documented:?}",
                claim.downstream_key(&name)
            );
            anomalies.push(Violation {
                invariant: "downstream-key",
                ..anomaly(request, observed)
            });
        }
        claim.enqueue(&name, message)?;
    }
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!(r#"{{"request":{}}}"#, request.index).into_bytes(),
    };
    match request.path {
        Path::Commit => match claim.commit(tx, &response).await {
            Ok(_) => Ok(Tried::Committed(Some(claimed_at))),
            Err(txoutbox::Error::StoreUnavailable { .. }) => Ok(Tried::Lost(Some(claimed_at))),
            Err(e) => Err(e.into()),
        },
        Path::Complete => {
            claim.complete(&tx, &response).await?;
            committed(tx.commit().await, Some(claimed_at))
        }
    }
}

/// What a commit's answer says: committed, not (the server refused it), or unknown (no answer,
/// or the server going away: the COMMIT may have been carried out).
fn committed(answer: Result<(), tokio_postgres::Error>, claimed_at: Option<i64>) -> Result<Tried> {
    match answer.map_err(txoutbox::Error::from) {
        Ok(()) => Ok(Tried::Committed(claimed_at)),
        Err(e) if e.is_unavailable() => Ok(Tried::Lost(claimed_at)),
        Err(e) => Err(e.into()),
    }
}

/// The request's effects, by name: one webhook per row, to the row's destination.
fn effects(plan: &Plan, request: &RequestPlan) -> Result<Vec<(String, OutboxMessage)>> {
    request
        .effects
        .iter()
        .enumerate()
        .map(|(n, &row)| {
            let payload = serde_json::json!({
                "event_type": "soak.row",
                "data": {"row": row, "request": request.index},
            });
            let message = OutboxMessage::new(plan.rows[row].destination, &payload)?;
            Ok((effect_name(n), message))
        })
        .collect()
}
