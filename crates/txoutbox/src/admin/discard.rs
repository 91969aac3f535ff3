//! Discard: failed or unknown messages closed without delivery.
//!
//! # Discard rules
//!
//! - A discarded row is closed without delivery: it leaves the hot table for
//!   `txoutbox_discarded`, with an attempt-log row (attempt 0, relay `operator`, outcome
//!   `discarded`, the operator's reason as its text, followed by `(by operator {name})` when
//!   [`DiscardOptions::operator`] names them). The next row of its ordering key is due at once: a
//!   dead-lettered head no longer blocks its key.
//! - Only `failed` and `unknown` rows are discarded. By ids, anything else refuses the whole
//!   discard and nothing changes (as for a replay); by filter, the statuses are the filter's when
//!   it is `failed` or `unknown`, else `failed`.
//! - A discarded row is not replayed (the effect can be enqueued again: its (destination, key)
//!   is free once the row left the hot table).
//!

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use serde::Serialize;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

use super::filter::FilterParams;
use super::refusals::{check_max, not_found};
use super::replay::Candidate;
use super::{AdminError, ReplaySelection, SkippedMessage, DEFAULT_REPLAY_BATCH};
use crate::outbox::lock_ordering_keys;
use crate::state::MessageStatus;
use crate::store::admin as store;

/// How to discard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscardOptions {
    /// Why the rows are closed without delivery: kept in the attempt log (outcome `discarded`)
    /// and on the discarded row. Must not be blank.
    pub reason: String,
    /// Change nothing; report what would be discarded.
    pub dry_run: bool,
    /// Refuse with [`AdminError::TooMany`], changing nothing, when more rows than this are
    /// selected (`None`: no bound).
    pub max_rows: Option<u64>,
    /// Rows per transaction of a discard by filter (default 500).
    pub batch_size: usize,
    /// Who asked for the discard (a dashboard user, say), named in each row's attempt-log text
    /// after the reason. The discarded row keeps the reason alone.
    pub operator: Option<String>,
}

impl DiscardOptions {
    /// Options for a discard with this reason (no dry run, no bound, batches of 500, no operator
    /// named).
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            dry_run: false,
            max_rows: None,
            batch_size: DEFAULT_REPLAY_BATCH,
            operator: None,
        }
    }
}

/// A message closed without delivery (or that would be, in a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiscardedMessage {
    /// The message id.
    pub id: Uuid,
    /// Its destination.
    pub destination: String,
    /// Its status before the discard (`failed` or `unknown`).
    pub from: MessageStatus,
    /// Its ordering key: the next row of this key is due at once.
    pub ordering_key: Option<String>,
}

/// What a discard did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct DiscardReport {
    /// True when nothing was changed.
    pub dry_run: bool,
    /// The rows discarded, in selection order.
    pub discarded: Vec<DiscardedMessage>,
    /// The rows a discard by filter left alone, with the reason.
    pub skipped: Vec<SkippedMessage>,
}

/// Closes failed or unknown messages without delivery (see the module's discard rules). `client`
/// runs the discard's own transactions.
///
/// ```
/// use txoutbox::admin::{discard, DiscardOptions, ReplaySelection};
///
/// # async fn run(client: &mut tokio_postgres::Client, id: uuid::Uuid)
/// #     -> Result<(), txoutbox::admin::AdminError> {
/// let options = DiscardOptions::new("refunded by hand, ticket 1234");
/// let report = discard(client, &ReplaySelection::Ids(vec![id]), &options).await?;
/// println!("{report:?}");
/// # Ok(())
/// # }
/// # txoutbox_test_support::doc_test(|mut client| async move {
/// #     use txoutbox::admin::MessageStatus;
/// #     let id = txoutbox_test_support::factory::message(&mut client)
/// #         .status(MessageStatus::Failed).create().await?;
/// #     run(&mut client, id).await?;
/// #     let counts = txoutbox_test_support::counts(&client).await?;
/// #     assert_eq!((counts.failed, counts.discarded), (0, 1));
/// #     Ok(())
/// # });
/// ```
pub async fn discard(
    client: &mut Client,
    selection: &ReplaySelection,
    options: &DiscardOptions,
) -> Result<DiscardReport, AdminError> {
    let reason = options.reason.trim();
    if reason.is_empty() {
        return Err(AdminError::Invalid(
            "a discard needs a reason (--reason): it is what the next operator reads".into(),
        ));
    }
    if reason.contains('\0') {
        return Err(AdminError::Invalid(
            "the reason holds a NUL character, which Postgres text cannot store".into(),
        ));
    }
    if options
        .operator
        .as_deref()
        .is_some_and(|n| n.contains('\0'))
    {
        return Err(AdminError::Invalid(
            "the operator's name holds a NUL character, which Postgres text cannot store".into(),
        ));
    }
    let mut report = DiscardReport {
        dry_run: options.dry_run,
        ..DiscardReport::default()
    };
    match selection {
        ReplaySelection::Ids(ids) => {
            let mut seen = HashSet::new();
            let ids: Vec<Uuid> = ids.iter().copied().filter(|id| seen.insert(*id)).collect();
            check_max(ids.len() as u64, options.max_rows)?;
            let allowed = [MessageStatus::Failed, MessageStatus::Unknown];
            let tx = client.transaction().await?;
            let batch = discard_batch(&tx, &ids, &allowed, true, reason, options).await?;
            commit_unless(tx, options.dry_run || batch.discarded.is_empty()).await?;
            report.discarded = batch.discarded;
        }
        ReplaySelection::Filter(filter) => {
            let allowed = match filter.status {
                None | Some(MessageStatus::Failed) => vec![MessageStatus::Failed],
                Some(MessageStatus::Unknown) => vec![MessageStatus::Unknown],
                Some(status) => {
                    return Err(AdminError::Invalid(format!(
                        "{status} rows are not discarded: only failed and unknown rows are"
                    )))
                }
            };
            let ids = store::discard::select(client, &allowed, &FilterParams::new(filter)?).await?;
            check_max(ids.len() as u64, options.max_rows)?;
            for chunk in ids.chunks(options.batch_size.max(1)) {
                let tx = client.transaction().await?;
                let batch = discard_batch(&tx, chunk, &allowed, false, reason, options).await?;
                commit_unless(tx, options.dry_run || batch.discarded.is_empty()).await?;
                report.discarded.extend(batch.discarded);
                report.skipped.extend(batch.skipped);
            }
        }
    }
    Ok(report)
}

/// What one discard transaction did.
struct DiscardBatch {
    discarded: Vec<DiscardedMessage>,
    skipped: Vec<SkippedMessage>,
}

/// Locks and checks `ids`, then (unless a dry run) discards them. `strict` (a discard by ids)
/// turns every refusal into the error of the whole discard; otherwise refused rows are skipped.
async fn discard_batch(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    allowed: &[MessageStatus],
    strict: bool,
    reason: &str,
    options: &DiscardOptions,
) -> Result<DiscardBatch, AdminError> {
    let mut batch = DiscardBatch {
        discarded: Vec::new(),
        skipped: Vec::new(),
    };
    if ids.is_empty() {
        return Ok(batch);
    }
    store::replay::set_lock_timeout(tx).await?;
    let mut found: HashMap<Uuid, Candidate> = store::replay::hot_rows(tx, ids, options.dry_run)
        .await?
        .into_iter()
        .map(|c| (c.id, c))
        .collect();
    for id in ids {
        let Some(c) = found.remove(id) else {
            if strict {
                return Err(match not_found(tx, *id).await? {
                    AdminError::NotReplayable { id, status, .. } => AdminError::NotReplayable {
                        id,
                        status,
                        reason: "it was discarded already".into(),
                    },
                    other => other,
                });
            }
            batch.skipped.push(SkippedMessage {
                id: *id,
                reason: "it left the outbox meanwhile".into(),
            });
            continue;
        };
        let refused = if c.status == MessageStatus::InFlight && c.leased {
            Some(AdminError::Leased {
                id: c.id,
                owner: c.lease_owner.clone().unwrap_or_default(),
                expires_at: c.lease_expires_at.unwrap_or_else(Utc::now),
            })
        } else if allowed.contains(&c.status) {
            None
        } else {
            Some(AdminError::NotReplayable {
                id: c.id,
                status: c.status,
                reason: "only failed and unknown rows are discarded (a pending or in-flight row \
                         is still being delivered)"
                    .into(),
            })
        };
        match refused {
            Some(refused) if strict => return Err(refused),
            Some(refused) => batch.skipped.push(SkippedMessage {
                id: c.id,
                reason: refused.to_string(),
            }),
            None => batch.discarded.push(DiscardedMessage {
                id: c.id,
                destination: c.destination,
                from: c.status,
                ordering_key: c.ordering_key,
            }),
        }
    }
    if options.dry_run || batch.discarded.is_empty() {
        return Ok(batch);
    }
    let ids: Vec<Uuid> = batch.discarded.iter().map(|d| d.id).collect();
    let note = discard_note(reason, options.operator.as_deref());
    // The discard makes the next row of each key due: an enqueue of the key that has not
    // committed wrote its row waiting behind these; the keys' locks let it commit first, so
    // the discard's statement sees it.
    let keys: Vec<Option<String>> = batch
        .discarded
        .iter()
        .map(|d| d.ordering_key.clone())
        .collect();
    lock_ordering_keys(&mut &*tx, &keys).await?;
    store::discard::discard(tx, &ids, reason, &note).await?;
    store::notify(tx).await?;
    Ok(batch)
}

/// The attempt-log text of a discard: the reason, and who gave it when known (as a replay's note
/// names them).
pub(super) fn discard_note(reason: &str, operator: Option<&str>) -> String {
    match operator {
        Some(name) => format!("{reason} (by operator {name})"),
        None => reason.to_owned(),
    }
}

/// Commits `tx`, or rolls it back when `rollback` (a dry run, or nothing changed).
async fn commit_unless(tx: Transaction<'_>, rollback: bool) -> Result<(), AdminError> {
    if rollback {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(())
}
