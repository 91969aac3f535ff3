//! Hides configured fields before anything reaches the browser, and fails closed. Every stored
//! document (a payload, its headers, a stored response) goes through [`Redaction::document`] or
//! [`Redaction::json`]: each object member with a listed name (without case), at any depth, has
//! its value replaced; a document that cannot be parsed, or is nested too deep to walk, cannot be
//! shown to be redacted and is withheld whole. Free text (errors, receipts, reasons) is scrubbed
//! by [`Scrubber`].

mod scrub;

pub(crate) use scrub::Scrubber;

use serde::{Serialize, Serializer};
use serde_json::Value;

/// What a redacted value becomes.
pub(crate) const REDACTED: &str = "[redacted]";

/// How deep a document may nest to be walked (serde_json's own parsing limit): a deeper one is
/// withheld rather than walked on the stack.
const MAX_DEPTH: usize = 128;

/// The configured redaction: the field names, and the shapes of value they imply.
#[derive(Debug, Clone, Default)]
pub(crate) struct Redaction {
    fields: Vec<String>,
    /// A field name mentions mail: email addresses are scrubbed from free text.
    emails: bool,
    /// A field name mentions a card: card numbers are scrubbed from free text.
    cards: bool,
}

/// A stored document as the browser may see it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Shown {
    /// JSON, with the configured fields replaced.
    Json(Value),
    /// Text that is not JSON, as stored: only when nothing is redacted.
    Text(String),
    /// Withheld whole: the text the browser gets instead.
    Withheld(String),
}

impl Shown {
    /// As text: the document pretty-printed, the text, or the placeholder.
    pub fn to_text(&self) -> String {
        match self {
            Shown::Json(v) => serde_json::to_string_pretty(v).unwrap_or_default(),
            Shown::Text(t) | Shown::Withheld(t) => t.clone(),
        }
    }
}

/// As JSON: the document, or the text or placeholder as a string.
impl Serialize for Shown {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Shown::Json(v) => v.serialize(serializer),
            Shown::Text(t) | Shown::Withheld(t) => serializer.serialize_str(t),
        }
    }
}

/// A document as shown, and the values it hid (what to scrub from its message's free text).
#[derive(Debug, Clone)]
pub(crate) struct Redacted {
    pub shown: Shown,
    /// The hidden values; `None` when the document is withheld (what it holds is unknown).
    pub hidden: Option<Vec<String>>,
}

/// The placeholder of a document that cannot be redacted.
fn withheld(why: &str) -> Redacted {
    Redacted {
        shown: Shown::Withheld(format!("[withheld: cannot be redacted ({why})]")),
        hidden: None,
    }
}

/// The walk went deeper than [`MAX_DEPTH`].
struct TooDeep;

impl Redaction {
    /// The redaction of `fields` (blank names are ignored).
    pub fn new(fields: &[String]) -> Self {
        let fields: Vec<String> = fields
            .iter()
            .map(|f| f.trim().to_owned())
            .filter(|f| !f.is_empty())
            .collect();
        let mentions = |word: &str| fields.iter().any(|f| f.to_ascii_lowercase().contains(word));
        Self {
            emails: mentions("mail"),
            cards: mentions("card") || fields.iter().any(|f| f.eq_ignore_ascii_case("pan")),
            fields,
        }
    }

    /// True when some field is redacted.
    pub fn is_on(&self) -> bool {
        !self.fields.is_empty()
    }

    /// True when `name` is one of the redacted fields.
    pub fn is_redacted(&self, name: &str) -> bool {
        self.fields.iter().any(|f| f.eq_ignore_ascii_case(name))
    }

    /// A header's value as shown: [`REDACTED`] when its name is a redacted field.
    pub fn header<'a>(&self, name: &str, value: &'a str) -> &'a str {
        if self.is_redacted(name) {
            REDACTED
        } else {
            value
        }
    }

    /// A stored document, as raw text: parsed, then [`Redaction::json`]. Text that is not JSON
    /// (or JSON serde_json refuses: a number out of range, nesting past 128 levels) is shown as
    /// is when nothing is redacted, else withheld.
    pub fn document(&self, raw: &[u8]) -> Redacted {
        match serde_json::from_slice::<Value>(raw) {
            Ok(value) => self.json(value),
            Err(_) if !self.is_on() => Redacted {
                shown: Shown::Text(String::from_utf8_lossy(raw).into_owned()),
                hidden: Some(Vec::new()),
            },
            Err(e) => withheld(&format!("not parseable JSON: {e}")),
        }
    }

    /// A stored document txoutbox could not decode into its shape (JSON serde_json refuses, or
    /// headers that are not what txoutbox writes), as raw text: shown as stored when nothing is
    /// redacted, else withheld whole, even when it parses: where a redacted field sits in a
    /// document of unknown shape (a header's name in a [name, value] pair) cannot be told.
    pub fn undecodable(&self, raw: &[u8]) -> Redacted {
        if self.is_on() {
            return withheld("not decodable");
        }
        Redacted {
            shown: Shown::Text(String::from_utf8_lossy(raw).into_owned()),
            hidden: Some(Vec::new()),
        }
    }

    /// A stored document, parsed: every member named in the fields (at any depth, in arrays
    /// too) replaced by [`REDACTED`]; withheld whole when it nests deeper than can be walked.
    pub fn json(&self, mut value: Value) -> Redacted {
        let mut hidden = Vec::new();
        if !self.is_on() {
            return Redacted {
                shown: Shown::Json(value),
                hidden: Some(hidden),
            };
        }
        match self.walk(&mut value, 0, &mut hidden) {
            Ok(()) => Redacted {
                shown: Shown::Json(value),
                hidden: Some(hidden),
            },
            Err(TooDeep) => withheld(&format!("nested deeper than {MAX_DEPTH} levels")),
        }
    }

    fn walk(
        &self,
        value: &mut Value,
        depth: usize,
        hidden: &mut Vec<String>,
    ) -> Result<(), TooDeep> {
        if depth > MAX_DEPTH {
            return Err(TooDeep);
        }
        match value {
            Value::Object(map) => {
                for (name, member) in map.iter_mut() {
                    if self.is_redacted(name) {
                        leaves(member, depth + 1, hidden)?;
                        *member = Value::String(REDACTED.into());
                    } else {
                        self.walk(member, depth + 1, hidden)?;
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.walk(item, depth + 1, hidden)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The scrubber of free text shown without its message's documents (lists, failure groups,
    /// flow-control reasons): by shape only.
    pub fn shapes(&self) -> Scrubber<'_> {
        Scrubber::new(self, Some(Vec::new()))
    }

    /// The scrubber of one message's free text: by shape, and of the values its documents hid;
    /// every text withheld when one of them was (`None` among `hidden`).
    pub fn scrubber<'a>(&'a self, hidden: &[&Option<Vec<String>>]) -> Scrubber<'a> {
        let mut values = Vec::new();
        for h in hidden {
            match h {
                Some(h) => values.extend(h.iter().cloned()),
                None => return Scrubber::new(self, None),
            }
        }
        Scrubber::new(self, Some(values))
    }
}

/// The scalar values under a hidden member, to search free text for: strings and numbers (not
/// booleans or null, which would match common words).
fn leaves(value: &Value, depth: usize, out: &mut Vec<String>) -> Result<(), TooDeep> {
    if depth > MAX_DEPTH {
        return Err(TooDeep);
    }
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Number(n) => out.push(n.to_string()),
        Value::Object(map) => {
            return map.values().try_for_each(|v| leaves(v, depth + 1, out));
        }
        Value::Array(items) => {
            return items.iter().try_for_each(|v| leaves(v, depth + 1, out));
        }
        Value::Bool(_) | Value::Null => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redaction() -> Redaction {
        Redaction::new(&["email".to_owned(), "card".to_owned()])
    }

    #[test]
    fn listed_fields_are_replaced_at_any_depth() {
        let v = serde_json::json!({
            "Email": "a@b.c",
            "order": {"items": [{"card": {"number": "4242"}, "sku": "x"}]},
            "note": "email",
        });
        let redacted = redaction().json(v);
        assert_eq!(
            redacted.shown,
            Shown::Json(serde_json::json!({
                "Email": REDACTED,
                "order": {"items": [{"card": REDACTED, "sku": "x"}]},
                "note": "email",
            }))
        );
        assert_eq!(
            redacted.hidden,
            Some(vec!["a@b.c".to_owned(), "4242".to_owned()])
        );
    }

    #[test]
    fn a_document_serde_json_refuses_is_withheld_whole() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for raw in [
            &br#"{"email":"carol@example.com","n":1e400}"#[..],
            br#"{"email":"carol@example.com"} trailing"#,
            b"email=carol@example.com",
            b"\xff\xfe{}",
            deep.as_bytes(),
        ] {
            let redacted = redaction().document(raw);
            let Shown::Withheld(text) = &redacted.shown else {
                panic!("shown: {:?}", redacted.shown);
            };
            assert!(
                text.starts_with("[withheld: cannot be redacted ("),
                "{text}"
            );
            assert!(!text.contains("carol"), "{text}");
            assert_eq!(redacted.hidden, None);
        }
    }

    #[test]
    fn a_parsed_document_nested_past_the_walk_limit_is_withheld() {
        let mut v = serde_json::json!({"email": "carol@example.com"});
        for _ in 0..MAX_DEPTH + 1 {
            v = Value::Array(vec![v]);
        }
        assert!(matches!(redaction().json(v).shown, Shown::Withheld(_)));
    }

    #[test]
    fn without_redaction_text_that_is_not_json_is_shown_as_stored() {
        let none = Redaction::new(&[" ".to_owned()]);
        assert!(!none.is_on());
        assert_eq!(
            none.document(b"<html>ok</html>").shown,
            Shown::Text("<html>ok</html>".into())
        );
    }

    #[test]
    fn field_names_imply_the_shapes_scrubbed_from_free_text() {
        let r = Redaction::new(&["customer_email".to_owned()]);
        assert!(r.emails && !r.cards);
        let r = Redaction::new(&["PAN".to_owned()]);
        assert!(r.cards && !r.emails);
        let r = Redaction::new(&["name".to_owned()]);
        assert!(!r.cards && !r.emails);
    }
}
