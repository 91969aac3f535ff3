//! The client's `Idempotency-Key`: parsed once at the edge, so everything past it holds a valid key.
//!
//! draft-ietf-httpapi-idempotency-key-header makes the header a Structured Field String (RFC 8941
//! §3.3.3): `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`. [`IdempotencyKey::from_header`]
//! reads that form, and the bare form (`Idempotency-Key: 8e03978e-...`) older clients send; both
//! spellings of a key are the same key.

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
#[non_exhaustive]
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
    /// Shorter than the scope accepts (see `Scope::with_min_key_len`): a short key can be
    /// guessed, or collide with another client's.
    #[error(
        "the Idempotency-Key is {len} characters long; at least {min} are required \
         (a UUID is the norm)"
    )]
    TooShort {
        /// The key's length.
        len: usize,
        /// The scope's shortest key.
        min: usize,
    },
    /// The header is not one Structured Field String (RFC 8941) nor one bare key: an
    /// unterminated quoted string, an escape other than `\"` and `\\`, parameters, or text
    /// after the closing quote.
    #[error("the Idempotency-Key header is not a valid sf-string: {0}")]
    Syntax(String),
    /// More than one key: two `Idempotency-Key` fields, or a list in one field.
    #[error("the request carries more than one Idempotency-Key; send exactly one")]
    Multiple,
}

impl KeyError {
    /// The HTTP status this error answers with.
    pub fn http_status(&self) -> u16 {
        400
    }
}

impl IdempotencyKey {
    /// Validates a key as it is, without quotes or escapes (a header value goes through
    /// [`IdempotencyKey::from_header`]). Surrounding whitespace is not trimmed: a key is opaque.
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

    /// Reads an `Idempotency-Key` field value: a Structured Field String (`"..."`, with `\"` and
    /// `\\` as the only escapes) or a bare key (visible ASCII without `"` at its start and
    /// without `,`). Leading and trailing spaces and tabs are not part of the value (RFC 9110
    /// §5.5). `"abc…"` and `abc…` give the same key.
    ///
    /// Refused: a list (`"a", "b"`: [`KeyError::Multiple`]), parameters (`"a";p=1`: the draft
    /// defines none), an unterminated string or another escape ([`KeyError::Syntax`]), and any
    /// key [`IdempotencyKey::parse`] refuses.
    pub fn from_header(value: &str) -> Result<Self, KeyError> {
        let value = value.trim_matches([' ', '\t']);
        let Some(quoted) = value.strip_prefix('"') else {
            if value.contains(',') {
                return Err(KeyError::Multiple);
            }
            return Self::parse(value);
        };
        let mut key = String::with_capacity(quoted.len());
        let mut chars = quoted.char_indices();
        let rest = loop {
            match chars.next() {
                None => return Err(KeyError::Syntax("the closing quote is missing".into())),
                Some((at, '"')) => break &quoted[at + 1..],
                Some((_, '\\')) => match chars.next() {
                    Some((_, c @ ('"' | '\\'))) => key.push(c),
                    Some((at, c)) if c.is_ascii_graphic() || c == ' ' => {
                        return Err(KeyError::Syntax(format!(
                            "\\{c} at byte {} is not an escape (only \\\" and \\\\ are)",
                            at + 1
                        )))
                    }
                    _ => {
                        return Err(KeyError::Syntax(
                            "a backslash must be followed by \" or \\".into(),
                        ))
                    }
                },
                Some((_, c)) if c == ' ' || c.is_ascii_graphic() => key.push(c),
                // Controls and non-ASCII are not in an sf-string (RFC 8941 §3.3.3).
                Some((at, _)) => return Err(KeyError::InvalidCharacter(at + 1)),
            }
        };
        let rest = rest.trim_start_matches(' ');
        match rest.chars().next() {
            None => Self::parse(&key),
            Some(',') => Err(KeyError::Multiple),
            Some(';') => Err(KeyError::Syntax(
                "parameters are not defined for Idempotency-Key".into(),
            )),
            Some(_) => Err(KeyError::Syntax("text follows the closing quote".into())),
        }
    }

    /// The key as sent by the client (without the quotes and escapes of its sf-string).
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
        for key in ["ab c", "ab\nc", "clé"] {
            assert_eq!(
                IdempotencyKey::parse(key),
                Err(KeyError::InvalidCharacter(2)),
                "{key:?}"
            );
        }
    }

    #[test]
    fn sql_metacharacters_are_just_characters() {
        let key = IdempotencyKey::parse("';DROP_TABLE_x;--").expect("visible ascii");
        assert_eq!(key.as_str(), "';DROP_TABLE_x;--");
    }

    const UUID: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

    #[test]
    fn the_quoted_and_the_bare_spelling_are_one_key() {
        let quoted = IdempotencyKey::from_header(&format!("\"{UUID}\"")).expect("sf-string");
        let bare = IdempotencyKey::from_header(UUID).expect("bare key");
        assert_eq!(quoted, bare);
        assert_eq!(quoted.as_str(), UUID);
    }

    #[test]
    fn spaces_and_tabs_around_the_value_are_not_part_of_the_key() {
        let key = IdempotencyKey::from_header(&format!(" \t\"{UUID}\"  ")).expect("trimmed");
        assert_eq!(key.as_str(), UUID);
        assert_eq!(
            IdempotencyKey::from_header(&format!("\t{UUID} ")).expect("trimmed"),
            key
        );
    }

    #[test]
    fn an_sf_string_unescapes_quote_and_backslash_only() {
        let key = IdempotencyKey::from_header(r#""a\"b\\c""#).expect("two escapes");
        assert_eq!(key.as_str(), r#"a"b\c"#);
        assert!(matches!(
            IdempotencyKey::from_header(r#""a\nb""#),
            Err(KeyError::Syntax(_))
        ));
        assert!(matches!(
            IdempotencyKey::from_header(r#""ab\"#),
            Err(KeyError::Syntax(_))
        ));
    }

    #[test]
    fn an_unterminated_sf_string_is_refused() {
        assert!(matches!(
            IdempotencyKey::from_header(&format!("\"{UUID}")),
            Err(KeyError::Syntax(_))
        ));
    }

    #[test]
    fn controls_and_non_ascii_inside_an_sf_string_are_refused() {
        // A space is an sf-string character, but not a key character.
        for (header, at) in [("\"ab\u{7f}c\"", 3), ("\"abé\"", 3), ("\"ab c\"", 2)] {
            assert_eq!(
                IdempotencyKey::from_header(header),
                Err(KeyError::InvalidCharacter(at)),
                "{header:?}"
            );
        }
    }

    #[test]
    fn a_list_of_keys_is_refused() {
        assert_eq!(
            IdempotencyKey::from_header(&format!("\"{UUID}\", \"{UUID}\"")),
            Err(KeyError::Multiple)
        );
        // Two bare keys joined by a proxy that combined two fields.
        assert_eq!(
            IdempotencyKey::from_header(&format!("{UUID}, {UUID}")),
            Err(KeyError::Multiple)
        );
    }

    #[test]
    fn parameters_and_text_after_the_string_are_refused() {
        assert!(matches!(
            IdempotencyKey::from_header(&format!("\"{UUID}\";v=1")),
            Err(KeyError::Syntax(_))
        ));
        assert!(matches!(
            IdempotencyKey::from_header(&format!("\"{UUID}\"x")),
            Err(KeyError::Syntax(_))
        ));
    }

    #[test]
    fn an_empty_sf_string_is_a_missing_key() {
        assert_eq!(IdempotencyKey::from_header("\"\""), Err(KeyError::Missing));
        assert_eq!(IdempotencyKey::from_header("  "), Err(KeyError::Missing));
    }

    #[test]
    fn errors_map_to_400() {
        assert_eq!(KeyError::Missing.http_status(), 400);
    }
}
