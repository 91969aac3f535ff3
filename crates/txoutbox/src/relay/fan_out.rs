//! The fan-out: the effects a scope with deferred effects (`Scope::with_deferred_effects`) stored
//! on its key rows become outbox rows, in batches, beside each claim. A key whose effects the
//! database refuses (a row edited by hand into something that is not an effect) is set aside by
//! this relay, logged, and never holds the others back.

use std::collections::HashSet;
use std::sync::Mutex;

use super::complete::refused;
use super::events::{RelayEvent, TestEvents};
use crate::error::{Error, Result};
use crate::store::{self, TxExecutor};

/// How many keys one fan-out empties at most: with a claim's batch of 100 and two effects a
/// request, enough for a claim or two.
pub(super) const FAN_OUT_KEYS: i64 = 100;

/// The keys this relay found poisoned (`scope\nkey`), skipped by its fan-outs from then on.
#[derive(Default)]
pub(super) struct Poisoned(Mutex<HashSet<String>>);

impl Poisoned {
    fn list(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn insert(&self, scope: &str, key: &str) {
        if let Ok(mut set) = self.0.lock() {
            set.insert(format!("{scope}\n{key}"));
        }
    }
}

/// What a fan-out did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct FannedOut {
    /// It emptied keys: rows are due that no claim sent before its commit can see.
    pub wrote: bool,
    /// There may be more (it emptied as many keys as it may).
    pub more: bool,
}

/// Moves the effects of up to [`FAN_OUT_KEYS`] keys into the outbox. A batch the database
/// refuses for a data reason is fanned out key by key, and a key refused alone is set aside.
pub(super) async fn fan_out(
    conn: &impl TxExecutor,
    poisoned: &Poisoned,
    events: &TestEvents,
) -> Result<FannedOut> {
    let skip = poisoned.list();
    let e = match store::keys::fan_out(conn, FAN_OUT_KEYS, &skip, None).await {
        Ok(done) => {
            if done.keys > 0 {
                tracing::trace!(
                    keys = done.keys,
                    rows = done.rows,
                    "fanned out deferred effects"
                );
                events.emit(RelayEvent::FannedOut {
                    n: done.keys as usize,
                });
            }
            return Ok(FannedOut {
                wrote: done.keys > 0,
                more: done.keys >= FAN_OUT_KEYS as u64,
            });
        }
        Err(e) => Error::from(e),
    };
    if refused(&e).is_none() {
        return Err(e);
    }
    let awaiting = store::keys::awaiting_fan_out(conn, FAN_OUT_KEYS, &skip).await?;
    let mut out = FannedOut {
        wrote: false,
        more: awaiting.len() >= FAN_OUT_KEYS as usize,
    };
    for (scope, key) in awaiting {
        match store::keys::fan_out(conn, 1, &skip, Some((&scope, &key))).await {
            Ok(done) if done.keys > 0 => {
                out.wrote = true;
                events.emit(RelayEvent::FannedOut { n: 1 });
            }
            Ok(_) => {}
            Err(e) => {
                let e = Error::from(e);
                if refused(&e).is_none() {
                    return Err(e);
                }
                tracing::error!(
                    scope = %scope, key = %key, error = %e,
                    "the effects stored on this key cannot be written to the outbox; this relay \
                     skips the key (its effects stay on the key row, which is not pruned)"
                );
                poisoned.insert(&scope, &key);
            }
        }
    }
    Ok(out)
}
