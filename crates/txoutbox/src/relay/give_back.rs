//! A row this relay gives up without a sink's answer: claimed but undecodable (dead-lettered
//! at once, fenced by its lease), or handed back unstarted; and the text stored for an error or
//! a receipt (no NUL, bounded).

use std::time::Duration;

use tokio::sync::mpsc;

use super::flow::Signal;
use super::held::{Held, Stage};
use super::{Finished, Inner, Lease, Outcome};

/// Dead-letters a claimed row whose stored data this relay cannot decode, without calling its
/// sink: its outcome goes to the completer like any other, fenced by its lease. No completion
/// hook runs (there is no delivery to hand it) and the destination's breaker learns nothing of
/// the downstream (the row is at fault): [`Signal::Inconclusive`], which frees a half-open
/// breaker's probe if this row was it.
pub(super) async fn dead_letter_undecodable(
    held: &Held,
    done: &mpsc::Sender<Finished>,
    lease: Lease,
    error: String,
) {
    let error = storable(error);
    tracing::warn!(message_id = %lease.delivery.id, destination = %lease.delivery.destination,
        error = %error, "undecodable row; dead-lettered");
    let (id, token) = (lease.delivery.id, lease.token);
    held.insert(lease.clone());
    let finished = Finished {
        finished: lease.now(),
        lease,
        outcome: Outcome::Failed,
        error: Some(error),
        receipt: None,
        delay: Duration::ZERO,
        completion: None,
        signal: Some(Signal::Inconclusive),
    };
    if done.send(finished).await.is_ok() {
        held.set(id, token, Stage::Finished);
    }
}

/// An outcome for a row whose attempt was cut short (or never began) at shutdown, without a
/// verdict on the downstream ([`Signal::Inconclusive`]).
pub(super) fn given_back(inner: &Inner, lease: Lease, outcome: Outcome) -> Finished {
    let (outcome, error) = match outcome {
        Outcome::Released if inner.at_most_once(&lease.delivery.destination) => (
            Outcome::Unknown,
            Some("the relay stopped during an at-most-once attempt: it may or may not have reached the downstream".to_owned()),
        ),
        Outcome::Released => (
            Outcome::Released,
            Some("the relay stopped during the attempt".to_owned()),
        ),
        other => (other, None),
    };
    Finished {
        finished: lease.now(),
        lease,
        outcome,
        error,
        receipt: None,
        delay: Duration::ZERO,
        completion: None,
        // A cut-short or unstarted attempt says nothing of the downstream; if it was a half-open
        // breaker's probe, the next probe goes at once instead of when this lease ends.
        signal: Some(Signal::Inconclusive),
    }
}

/// Text the database will store: no NUL (Postgres text cannot hold it) and at most
/// [`MAX_TEXT`] bytes, cut at a character boundary, with the full length said. Error text and
/// receipts come from downstreams: a hostile one must not make an outcome unwritable.
pub(super) fn storable(text: String) -> String {
    let clean = if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    };
    if clean.len() <= MAX_TEXT {
        return clean;
    }
    let mut cut = MAX_TEXT;
    while !clean.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &clean[..cut], clean.len())
}

/// The longest error or receipt text stored for one attempt.
pub(super) const MAX_TEXT: usize = 2048;
