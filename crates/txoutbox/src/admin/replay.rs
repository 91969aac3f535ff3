//! Replay: failed, unknown or delivered messages put back to pending.
//!
//! # Replay rules
//!
//! - **By ids**, each id must name a `failed` or `unknown` row, or a `delivered` one when
//!   [`ReplayOptions::include_delivered`] is set. Naming an `unknown` row (an at-most-once attempt
//!   whose outcome was lost) is the operator's explicit decision that it did not happen. Anything
//!   else refuses the whole replay, and nothing changes: an unknown id ([`AdminError::NotFound`]),
//!   a row a relay holds under a live lease ([`AdminError::Leased`]), a `pending` row or an
//!   `in_flight` one whose lease ran out ([`AdminError::NotReplayable`]).
//! - **By filter**, the statuses replayed are the filter's status when it is `failed` or
//!   `unknown` (`unknown` rows are replayed only when asked for by name), else `failed`;
//!   `include_delivered` adds `delivered` rows. Rows that change state while the replay runs are
//!   skipped and reported.
//! - A replayed row is `pending`, due now, with 0 attempts, no lease and no last error, and keeps
//!   its downstream key, unless [`ReplayOptions::new_key`] asks for [`replay_downstream_key`]. A
//!   delivered row moves back to `txoutbox_messages`. Every replayed row gets an attempt-log row
//!   (attempt 0, relay `operator`, outcome `replayed`, the key it carries, and a note naming the old
//!   key when it changed).
//! - Rows are locked (`FOR UPDATE`) and checked in the transaction that changes them, so a relay
//!   cannot claim or complete one halfway: its claim skips locked rows, its completion waits.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use serde::Serialize;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

pub use crate::downstream_key::replay_downstream_key;

use super::filter::FilterParams;
use super::refusals::{check_max, not_found, DISCARDED_REASON};
use super::{tell, AdminError, MessageFilter, ReplaySelection, DEFAULT_REPLAY_BATCH};
use crate::outbox::lock_ordering_keys;
use crate::state::MessageStatus;
use crate::store::admin as store;
pub(super) use crate::store::admin::replay::Candidate;

/// How to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Replay delivered rows too (the effect is sent again).
    pub include_delivered: bool,
    /// Give each row a fresh downstream key ([`replay_downstream_key`]): for a downstream that
    /// remembers the old key's answer (a cached permanent error).
    pub new_key: bool,
    /// Change nothing; report what would be replayed.
    pub dry_run: bool,
    /// Refuse with [`AdminError::TooMany`], changing nothing, when more rows than this are
    /// selected (`None`: no bound). The command uses it for "confirm with --yes".
    pub max_rows: Option<u64>,
    /// Rows per transaction of a replay by filter (default 500).
    pub batch_size: usize,
    /// Who asked for the replay (a dashboard user, say), named in each row's attempt-log note.
    pub operator: Option<String>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            include_delivered: false,
            new_key: false,
            dry_run: false,
            max_rows: None,
            batch_size: DEFAULT_REPLAY_BATCH,
            operator: None,
        }
    }
}

/// A message put back to pending (or that would be, in a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayedMessage {
    /// The message id.
    pub id: Uuid,
    /// Its destination.
    pub destination: String,
    /// Its status before the replay.
    pub from: MessageStatus,
    /// The downstream key it is delivered with from now on.
    pub downstream_key: String,
    /// The key it carried before, when the replay gave it a new one.
    pub replaced_key: Option<String>,
}

/// A message a replay by filter selected but left alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedMessage {
    /// The message id.
    pub id: Uuid,
    /// Why (it changed state since it was selected, or its key is taken).
    pub reason: String,
}

/// What a replay did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ReplayReport {
    /// True when nothing was changed.
    pub dry_run: bool,
    /// The rows replayed, in selection order.
    pub replayed: Vec<ReplayedMessage>,
    /// The rows left alone, with the reason.
    pub skipped: Vec<SkippedMessage>,
}

/// Replays messages (see the module's replay rules). `client` runs the replay's own
/// transactions; `progress`, when given, is called with (rows done, rows selected) after each
/// batch.
///
/// ```
/// use txoutbox::admin::{replay, MessageFilter, MessageStatus, ReplayOptions, ReplaySelection};
///
/// # async fn run(client: &mut tokio_postgres::Client) -> Result<(), txoutbox::admin::AdminError> {
/// // The webhook's dead letters, once its receiver is fixed: count first, then replay.
/// let selection = ReplaySelection::Filter(MessageFilter {
///     status: Some(MessageStatus::Failed),
///     destination: Some("webhook".into()),
///     ..MessageFilter::default()
/// });
/// let dry_run = ReplayOptions { dry_run: true, ..ReplayOptions::default() };
/// let would = replay(client, &selection, &dry_run, None).await?;
/// println!("{} to replay, {} left alone", would.replayed.len(), would.skipped.len());
/// let options = ReplayOptions { operator: Some("ops@example.com".into()), ..ReplayOptions::default() };
/// let done = replay(client, &selection, &options, None).await?;
/// println!("{} pending again", done.replayed.len());
/// # Ok(())
/// # }
/// # txoutbox_test_support::doc_test(|mut client| async move {
/// #     txoutbox_test_support::factory::message(&mut client).destination("webhook")
/// #         .status(MessageStatus::Failed).create_many(2).await?;
/// #     run(&mut client).await?;
/// #     let counts = txoutbox_test_support::counts(&client).await?;
/// #     assert_eq!((counts.failed, counts.pending), (0, 2));
/// #     Ok(())
/// # });
/// ```
pub async fn replay(
    client: &mut Client,
    selection: &ReplaySelection,
    options: &ReplayOptions,
    mut progress: Option<&mut (dyn FnMut(u64, u64) + Send)>,
) -> Result<ReplayReport, AdminError> {
    let mut report = ReplayReport {
        dry_run: options.dry_run,
        ..ReplayReport::default()
    };
    match selection {
        ReplaySelection::Ids(ids) => {
            let mut seen = HashSet::new();
            let ids: Vec<Uuid> = ids.iter().copied().filter(|id| seen.insert(*id)).collect();
            check_max(ids.len() as u64, options.max_rows)?;
            let mut allowed = vec![MessageStatus::Failed, MessageStatus::Unknown];
            if options.include_delivered {
                allowed.push(MessageStatus::Delivered);
            }
            let tx = client.transaction().await?;
            let batch = replay_batch(&tx, &ids, &allowed, true, options).await?;
            finish(tx, &batch, options).await?;
            report.replayed = batch.replayed;
            tell(&mut progress, ids.len() as u64, ids.len() as u64);
        }
        ReplaySelection::Filter(filter) => {
            let allowed = replayed_statuses(filter, options)?;
            let ids = store::replay::select(client, &allowed, &FilterParams::new(filter)?).await?;
            let total = ids.len() as u64;
            check_max(total, options.max_rows)?;
            let mut done = 0;
            for chunk in ids.chunks(options.batch_size.max(1)) {
                let tx = client.transaction().await?;
                let batch = replay_batch(&tx, chunk, &allowed, false, options).await?;
                finish(tx, &batch, options).await?;
                report.replayed.extend(batch.replayed);
                report.skipped.extend(batch.skipped);
                done += chunk.len() as u64;
                tell(&mut progress, done, total);
            }
        }
    }
    Ok(report)
}

/// The statuses a replay by `filter` acts on.
pub(super) fn replayed_statuses(
    filter: &MessageFilter,
    options: &ReplayOptions,
) -> Result<Vec<MessageStatus>, AdminError> {
    let mut statuses = match filter.status {
        None | Some(MessageStatus::Failed) => vec![MessageStatus::Failed],
        Some(MessageStatus::Unknown) => vec![MessageStatus::Unknown],
        Some(MessageStatus::Delivered) if options.include_delivered => vec![],
        Some(MessageStatus::Delivered) => {
            return Err(AdminError::Invalid(
                "delivered rows are replayed only with include_delivered (--include-delivered): \
                 their effect is sent again"
                    .into(),
            ))
        }
        Some(
            status @ (MessageStatus::Pending | MessageStatus::InFlight | MessageStatus::Discarded),
        ) => {
            return Err(AdminError::Invalid(format!(
                "{status} rows are not replayed: only failed, unknown and delivered rows are"
            )))
        }
    };
    if options.include_delivered {
        statuses.push(MessageStatus::Delivered);
    }
    Ok(statuses)
}

/// What one replay transaction did.
#[derive(Default)]
struct Batch {
    replayed: Vec<ReplayedMessage>,
    skipped: Vec<SkippedMessage>,
    delivered: Vec<Option<String>>,
}

/// Why `candidate` is not replayed, if it is not.
fn refusal(candidate: &Candidate, allowed: &[MessageStatus]) -> Option<AdminError> {
    let status = candidate.status;
    if status == MessageStatus::InFlight && candidate.leased {
        return Some(AdminError::Leased {
            id: candidate.id,
            owner: candidate.lease_owner.clone().unwrap_or_default(),
            expires_at: candidate.lease_expires_at.unwrap_or_else(Utc::now),
        });
    }
    if allowed.contains(&status) {
        return None;
    }
    let reason = match status {
        MessageStatus::Pending => "it waits for delivery already".to_owned(),
        MessageStatus::InFlight => "its lease ran out; a relay takes it back shortly (to pending, \
             or to unknown for an at-most-once destination)"
            .to_owned(),
        MessageStatus::Delivered => "replaying it sends the effect again: set include_delivered \
             (--include-delivered) to do that"
            .to_owned(),
        MessageStatus::Failed | MessageStatus::Unknown => {
            format!("{status} rows are not selected")
        }
        MessageStatus::Discarded => DISCARDED_REASON.to_owned(),
    };
    Some(AdminError::NotReplayable {
        id: candidate.id,
        status,
        reason,
    })
}

/// The writes one replay transaction makes: hot rows reset, delivered rows moved back, each with
/// the key it carries from now on, and the attempt-log note of every replayed row.
#[derive(Default)]
struct Plan {
    hot_ids: Vec<Uuid>,
    hot_keys: Vec<String>,
    back_ids: Vec<Uuid>,
    back_keys: Vec<String>,
    notes: Vec<String>,
}

/// Locks and checks `ids`, then (unless a dry run) replays them. `strict` (a replay by ids) turns
/// every refusal into the error of the whole replay; otherwise refused rows are skipped.
async fn replay_batch(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    allowed: &[MessageStatus],
    strict: bool,
    options: &ReplayOptions,
) -> Result<Batch, AdminError> {
    let mut batch = Batch::default();
    if ids.is_empty() {
        return Ok(batch);
    }
    let found = lock(tx, ids, options.dry_run).await?;
    let plan = plan(tx, ids, found, allowed, strict, options, &mut batch).await?;
    if options.dry_run || batch.replayed.is_empty() {
        return Ok(batch);
    }
    apply(tx, &plan, &batch).await?;
    Ok(batch)
}

/// The rows among `ids`, hot or delivered, locked (read only in a dry run), by id.
async fn lock(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    dry_run: bool,
) -> Result<HashMap<Uuid, Candidate>, AdminError> {
    store::replay::set_lock_timeout(tx).await?;
    let mut found: HashMap<Uuid, Candidate> = store::replay::hot_rows(tx, ids, dry_run)
        .await?
        .into_iter()
        .map(|c| (c.id, c))
        .collect();
    let rest: Vec<Uuid> = ids
        .iter()
        .filter(|id| !found.contains_key(id))
        .copied()
        .collect();
    if !rest.is_empty() {
        for c in store::replay::delivered_rows(tx, &rest, dry_run).await? {
            found.insert(c.id, c);
        }
    }
    Ok(found)
}

/// Decides, row by row, what is replayed and with which key: the refused rows (and those whose
/// key is taken) go to `batch.skipped`, or fail the whole replay when `strict`; the others to
/// `batch.replayed`.
async fn plan(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    mut found: HashMap<Uuid, Candidate>,
    allowed: &[MessageStatus],
    strict: bool,
    options: &ReplayOptions,
    batch: &mut Batch,
) -> Result<Plan, AdminError> {
    let mut replayable = Vec::new();
    for id in ids {
        let Some(candidate) = found.remove(id) else {
            if strict {
                return Err(not_found(tx, *id).await?);
            }
            batch.skipped.push(SkippedMessage {
                id: *id,
                reason: "it was purged meanwhile".into(),
            });
            continue;
        };
        match refusal(&candidate, allowed) {
            Some(refused) if strict => return Err(refused),
            Some(refused) => batch.skipped.push(SkippedMessage {
                id: *id,
                reason: refused.to_string(),
            }),
            None => replayable.push(candidate),
        }
    }
    let taken = if options.new_key {
        HashMap::new()
    } else {
        taken_keys(tx, &replayable).await?
    };

    let mut plan = Plan::default();
    for c in replayable {
        if let Some(other) = taken.get(&c.id) {
            let conflict = AdminError::KeyConflict {
                id: c.id,
                other: *other,
                downstream_key: c.downstream_key.clone(),
            };
            if strict {
                return Err(conflict);
            }
            batch.skipped.push(SkippedMessage {
                id: c.id,
                reason: conflict.to_string(),
            });
            continue;
        }
        let key = if options.new_key {
            replay_downstream_key(c.id, &c.downstream_key)
        } else {
            c.downstream_key.clone()
        };
        let by = match &options.operator {
            Some(name) => format!("operator {name}"),
            None => "an operator".to_owned(),
        };
        plan.notes.push(if options.new_key {
            format!(
                "replayed from {} by {by}; new downstream key {key} replaces {}",
                c.status, c.downstream_key
            )
        } else {
            format!("replayed from {} by {by}; downstream key kept", c.status)
        });
        if c.status == MessageStatus::Delivered {
            plan.back_ids.push(c.id);
            plan.back_keys.push(key.clone());
            batch.delivered.push(c.ordering_key.clone());
        } else {
            plan.hot_ids.push(c.id);
            plan.hot_keys.push(key.clone());
        }
        batch.replayed.push(ReplayedMessage {
            id: c.id,
            destination: c.destination,
            from: c.status,
            replaced_key: options.new_key.then_some(c.downstream_key),
            downstream_key: key,
        });
    }
    Ok(plan)
}

/// The delivered rows among `replayable` that cannot go back with their key, each with the row
/// that carries it: a delivered row that keeps its key must not meet the same (destination, key)
/// in the hot table (the effect was enqueued again since, or another row of this replay takes it
/// back).
async fn taken_keys(
    tx: &Transaction<'_>,
    replayable: &[Candidate],
) -> Result<HashMap<Uuid, Uuid>, AdminError> {
    let back: Vec<&Candidate> = replayable
        .iter()
        .filter(|c| c.status == MessageStatus::Delivered)
        .collect();
    if back.is_empty() {
        return Ok(HashMap::new());
    }
    let ids: Vec<Uuid> = back.iter().map(|c| c.id).collect();
    let destinations: Vec<&str> = back.iter().map(|c| c.destination.as_str()).collect();
    let keys: Vec<&str> = back.iter().map(|c| c.downstream_key.as_str()).collect();
    let mut taken: HashMap<Uuid, Uuid> = store::replay::keys_taken(tx, &ids, &destinations, &keys)
        .await?
        .into_iter()
        .collect();
    let mut first: HashMap<(&str, &str), Uuid> = HashMap::new();
    for c in &back {
        let earlier = *first
            .entry((c.destination.as_str(), c.downstream_key.as_str()))
            .or_insert(c.id);
        if earlier != c.id {
            taken.entry(c.id).or_insert(earlier);
        }
    }
    Ok(taken)
}

/// Makes the planned writes, logs them and hints the relays.
async fn apply(tx: &Transaction<'_>, plan: &Plan, batch: &Batch) -> Result<(), AdminError> {
    if !plan.hot_ids.is_empty() {
        store::replay::put_back(tx, false, &plan.hot_ids, &plan.hot_keys).await?;
    }
    if !plan.back_ids.is_empty() {
        // Re-inserted rows take a new seq: under the ordering-key locks enqueue takes, so that
        // seq stays commit order within a key.
        lock_ordering_keys(&mut &*tx, &batch.delivered).await?;
        store::replay::put_back(tx, true, &plan.back_ids, &plan.back_keys).await?;
    }
    let ids: Vec<Uuid> = batch.replayed.iter().map(|r| r.id).collect();
    let keys: Vec<&str> = batch
        .replayed
        .iter()
        .map(|r| r.downstream_key.as_str())
        .collect();
    store::replay::log_replays(tx, &ids, &keys, &plan.notes).await?;
    store::notify(tx).await
}

/// Commits a batch's transaction, or rolls a dry run's back.
async fn finish(
    tx: Transaction<'_>,
    batch: &Batch,
    options: &ReplayOptions,
) -> Result<(), AdminError> {
    if options.dry_run || batch.replayed.is_empty() {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(())
}
