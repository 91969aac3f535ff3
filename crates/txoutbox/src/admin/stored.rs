//! A JSON column read back from a stored row, one row at a time: decoded, or its stored text
//! with the reason when this build cannot decode it (JSON Postgres accepts and serde_json
//! refuses, written by another program or by hand). An operator can still see such a row, and
//! discard or replay it.

use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};

/// A stored JSON document (a payload, headers, a stored response's headers) as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredJson<T> {
    /// Decoded.
    Decoded(T),
    /// Not decodable by this build: nesting deeper than 128, a number beyond `f64` such as
    /// `1e400`, or not the shape it should have (headers that are not an object of strings).
    Undecodable {
        /// The document as Postgres prints it.
        text: String,
        /// Why it cannot be decoded.
        error: String,
    },
}

impl<T: DeserializeOwned> StoredJson<T> {
    /// Decodes the stored `text`.
    pub(crate) fn decode(text: String) -> Self {
        match serde_json::from_str(&text) {
            Ok(value) => StoredJson::Decoded(value),
            Err(e) => StoredJson::Undecodable {
                text,
                error: e.to_string(),
            },
        }
    }
}

impl<T> StoredJson<T> {
    /// The decoded document, if it could be decoded.
    pub fn decoded(&self) -> Option<&T> {
        match self {
            StoredJson::Decoded(value) => Some(value),
            StoredJson::Undecodable { .. } => None,
        }
    }
}

/// As JSON: the decoded document itself; an undecodable one as
/// `{"undecodable": <why>, "text": <the stored text>}`.
impl<T: Serialize> Serialize for StoredJson<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            StoredJson::Decoded(value) => value.serialize(serializer),
            StoredJson::Undecodable { text, error } => {
                #[derive(Serialize)]
                struct Undecodable<'a> {
                    undecodable: &'a str,
                    text: &'a str,
                }
                Undecodable {
                    undecodable: error,
                    text,
                }
                .serialize(serializer)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_serde_json_refuses_keeps_its_text_and_the_reason() -> serde_json::Result<()> {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let stored = StoredJson::<serde_json::Value>::decode(deep.clone());
        let StoredJson::Undecodable { text, error } = &stored else {
            panic!("decoded: {stored:?}");
        };
        assert_eq!(text, &deep);
        assert!(error.contains("recursion limit exceeded"), "{error}");
        let json = serde_json::to_value(&stored)?;
        assert_eq!(json["text"], deep.as_str());
        Ok(())
    }

    #[test]
    fn a_decodable_document_serialises_as_itself() -> serde_json::Result<()> {
        let stored = StoredJson::<serde_json::Value>::decode(r#"{"a": 1}"#.to_owned());
        assert_eq!(serde_json::to_value(&stored)?, serde_json::json!({"a": 1}));
        Ok(())
    }
}
