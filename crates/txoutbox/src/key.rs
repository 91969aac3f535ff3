//! The client's `Idempotency-Key`: parsed once at the edge, so everything past it holds a valid key.

use std::fmt;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 visible ASCII characters (`!` to `~`).
///
/// A UUID (v4 or v7) generated once per logical operation is the norm; any opaque token of that
/// alphabet is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a header value is not a usable key. Maps to `400 Bad Request`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// No key, or an empty one.
    #[error("the Idempotency-Key is missing or empty")]
    Missing,
    /// Longer than [`MAX_KEY_LEN`] bytes.
    #[error("the Idempotency-Key is {0} bytes long; at most {MAX_KEY_LEN} are allowed")]
    TooLong(usize),
    /// A byte outside visible ASCII (space, control characters, non-ASCII).
    #[error("the Idempotency-Key has a character outside visible ASCII at byte {0}")]
    InvalidCharacter(usize),
}

impl KeyError {
    /// The HTTP status this error answers with.
    pub fn http_status(&self) -> u16 {
        400
    }
}

impl IdempotencyKey {
    /// Validates a header value. Surrounding whitespace is not trimmed: a key is opaque.
    pub fn parse(value: &str) -> Result<Self, KeyError> {
        if value.is_empty() {
            return Err(KeyError::Missing);
        }
        if value.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong(value.len()));
        }
        if let Some(at) = value.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(KeyError::InvalidCharacter(at));
        }
        Ok(Self(value.to_owned()))
    }

    /// The key as sent by the client.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_a_key() {
        let key = IdempotencyKey::parse("0190f5e2-6c1c-7a8e-9f00-1234567890ab").expect("valid");
        assert_eq!(key.as_str(), "0190f5e2-6c1c-7a8e-9f00-1234567890ab");
    }

    #[test]
    fn empty_key_is_missing() {
        assert_eq!(IdempotencyKey::parse(""), Err(KeyError::Missing));
    }

    #[test]
    fn key_of_255_bytes_is_accepted_and_256_rejected() {
        assert!(IdempotencyKey::parse(&"a".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::parse(&"a".repeat(256)),
            Err(KeyError::TooLong(256))
        );
    }

    #[test]
    fn spaces_controls_and_non_ascii_are_rejected() {
        assert_eq!(
            IdempotencyKey::parse("ab c"),
            Err(KeyError::InvalidCharacter(2))
        );
        assert_eq!(
            IdempotencyKey::parse("ab\nc"),
            Err(KeyError::InvalidCharacter(2))
        );
        assert_eq!(
            IdempotencyKey::parse("clé"),
            Err(KeyError::InvalidCharacter(2))
        );
    }

    #[test]
    fn sql_metacharacters_are_just_characters() {
        let key = IdempotencyKey::parse("';DROP_TABLE_x;--").expect("visible ascii");
        assert_eq!(key.as_str(), "';DROP_TABLE_x;--");
    }

    #[test]
    fn errors_map_to_400() {
        assert_eq!(KeyError::Missing.http_status(), 400);
    }
}
