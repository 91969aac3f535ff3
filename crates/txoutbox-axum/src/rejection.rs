//! Why the [`Idempotent`](crate::Idempotent) extractor refuses a request: a typed rejection, as
//! axum's own extractors have, answered as the same problem document whatever the handler does.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use txoutbox::idempotency::KeyError;

use crate::Problem;

/// The rejection of [`Idempotent`](crate::Idempotent): each variant answers as a problem
/// document (`application/problem+json`, see [`Problem`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum IdempotencyRejection {
    /// A request other than GET/HEAD without an `Idempotency-Key` (400 `problem-missing-key`).
    MissingKey,
    /// Two `Idempotency-Key` fields (400 `problem-multiple-keys`): which one would be the key is
    /// a guess, and the draft says a client sends one.
    MultipleKeys,
    /// An `Idempotency-Key` field whose bytes are not visible ASCII (400
    /// `problem-malformed-key`).
    NotVisibleAscii,
    /// An `Idempotency-Key` that [`IdempotencyKey::from_header`](txoutbox::IdempotencyKey::from_header)
    /// refuses (400: `problem-malformed-key`, or `problem-multiple-keys` for a list in one field).
    InvalidKey(KeyError),
    /// A body that could not be read (413 `problem-body-too-large` over the size limit, else
    /// `problem-invalid-body` with the status axum gave).
    Body(BytesRejection),
}

impl IdempotencyRejection {
    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        self.problem().status
    }

    /// The problem document it answers with.
    pub fn problem(&self) -> Problem {
        match self {
            Self::MissingKey => Problem::missing_key(),
            Self::MultipleKeys => Problem::multiple_keys(),
            Self::NotVisibleAscii => Problem::malformed_key("the key must be visible ASCII"),
            Self::InvalidKey(e) => Problem::from(e),
            Self::Body(rejection) => crate::problem::unreadable_body(rejection),
        }
    }
}

impl std::fmt::Display for IdempotencyRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingKey => f.write_str("the request has no Idempotency-Key"),
            Self::MultipleKeys => f.write_str("the request has more than one Idempotency-Key"),
            Self::NotVisibleAscii => f.write_str("the Idempotency-Key is not visible ASCII"),
            Self::InvalidKey(e) => e.fmt(f),
            Self::Body(rejection) => {
                write!(
                    f,
                    "the request body could not be read: {}",
                    rejection.body_text()
                )
            }
        }
    }
}

impl std::error::Error for IdempotencyRejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidKey(e) => Some(e),
            Self::Body(rejection) => Some(rejection),
            _ => None,
        }
    }
}

answers_as_problem!(IdempotencyRejection);
