//! The rows this relay holds, from their claim until their outcome is written: the claim never
//! takes a row held here, and the shutdown gives back what is left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::{Finished, Lease};

/// Where a held row is: from its claim until its outcome is written, a row is in this relay's
/// [`Held`] map, and the claim never takes a row it holds (a relay never runs two attempts of one
/// row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Claimed; its sink was not called.
    Claimed,
    /// The sink call may have started.
    Calling,
    /// Its outcome is queued for the completer.
    Finished,
}

/// The rows this relay holds, by id.
#[derive(Clone, Default)]
pub(super) struct Held(Arc<Mutex<HashMap<Uuid, (Lease, Stage)>>>);

impl Held {
    pub(super) fn insert(&self, lease: Lease) {
        if let Ok(mut held) = self.0.lock() {
            held.insert(lease.delivery.id, (lease, Stage::Claimed));
        }
    }

    pub(super) fn set(&self, id: Uuid, token: i64, stage: Stage) {
        if let Ok(mut held) = self.0.lock() {
            if let Some(entry) = held.get_mut(&id).filter(|(l, _)| l.token == token) {
                entry.1 = stage;
            }
        }
    }

    /// Forgets the rows whose outcome was written (or given up on).
    pub(super) fn forget(&self, written: &[Finished]) {
        if let Ok(mut held) = self.0.lock() {
            for f in written {
                let id = f.lease.delivery.id;
                if held.get(&id).is_some_and(|(l, _)| l.token == f.lease.token) {
                    held.remove(&id);
                }
            }
        }
    }

    /// How many rows this relay holds.
    pub(super) fn len(&self) -> usize {
        self.0.lock().map(|h| h.len()).unwrap_or(0)
    }

    pub(super) fn contains(&self, id: Uuid) -> bool {
        self.0.lock().map(|h| h.contains_key(&id)).unwrap_or(false)
    }

    /// How many rows this relay holds per destination.
    pub(super) fn per_destination(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        if let Ok(held) = self.0.lock() {
            for (lease, _) in held.values() {
                *counts
                    .entry(lease.delivery.destination.clone())
                    .or_insert(0) += 1;
            }
        }
        counts
    }

    pub(super) fn ids(&self) -> Vec<Uuid> {
        self.0
            .lock()
            .map(|h| h.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The ids whose sink call started and whose outcome is not written.
    pub(super) fn called(&self) -> Vec<Uuid> {
        self.0
            .lock()
            .map(|h| {
                h.iter()
                    .filter(|(_, (_, s))| *s != Stage::Claimed)
                    .map(|(id, _)| *id)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The rows whose outcome was never produced (claimed, or cut off mid-call), for give-back.
    pub(super) fn unfinished(&self) -> Vec<(Lease, Stage)> {
        self.0
            .lock()
            .map(|h| {
                h.values()
                    .filter(|(_, s)| *s != Stage::Finished)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}
