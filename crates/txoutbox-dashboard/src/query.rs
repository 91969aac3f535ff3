//! A list's filter as its query string (or form) carries it, and back: the same fields on the
//! `/messages` page, its pagination links, the "replay all matching" form and the API; and a
//! destination as one path segment of the pause and resume actions.

use std::time::Duration;

use chrono::{DateTime, Utc};
use txoutbox::admin::{ListCursor, MessageFilter, MessageStatus, TimeBound};

use crate::redact::Redaction;
use crate::Failure;

/// The filter fields, as given (empty fields dropped).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FilterFields {
    pub status: Option<String>,
    pub destination: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub key: Option<String>,
    pub ordering_key: Option<String>,
    pub error: Option<String>,
    pub error_class: Option<String>,
}

/// Every `name=value` pair of a query string or form body, in order.
pub(crate) fn pairs(input: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(input).into_owned().collect()
}

impl FilterFields {
    /// The filter fields among `pairs` (the last of a repeated name wins).
    pub fn from_pairs(pairs: &[(String, String)]) -> Self {
        let mut f = FilterFields::default();
        for (name, value) in pairs {
            let value = Some(value.trim().to_owned()).filter(|v| !v.is_empty());
            let slot = match name.as_str() {
                "status" => &mut f.status,
                "destination" => &mut f.destination,
                "since" => &mut f.since,
                "until" => &mut f.until,
                "key" | "downstream_key" => &mut f.key,
                "ordering_key" => &mut f.ordering_key,
                "error" => &mut f.error,
                "error_class" => &mut f.error_class,
                _ => continue,
            };
            *slot = value;
        }
        // A group's class may be "" (rows without an error): keep it when given empty.
        if f.error_class.is_none()
            && pairs
                .iter()
                .any(|(n, v)| n == "error_class" && v.is_empty())
        {
            f.error_class = Some(String::new());
        }
        f
    }

    /// The fields as (name, value) pairs, for links and hidden form fields.
    pub fn to_pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("status", &self.status),
            ("destination", &self.destination),
            ("since", &self.since),
            ("until", &self.until),
            ("key", &self.key),
            ("ordering_key", &self.ordering_key),
            ("error", &self.error),
            ("error_class", &self.error_class),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_deref().map(|v| (name, v)))
        .collect()
    }

    /// The core's filter (without cursor or limit). With redacted fields, a search of the error
    /// text is refused: it matches the stored text, so it would confirm a value the dashboard
    /// hides; so is an error class holding text the dashboard scrubs (the failure groups'
    /// classes hold none: their addresses and digits are normalised).
    pub fn filter(&self, redaction: &Redaction) -> Result<MessageFilter, Failure> {
        for (name, value) in self.to_pairs() {
            storable(name, value)?;
        }
        if redaction.is_on() && self.error.is_some() {
            return Err(Failure::BadRequest(
                "the error-text search (error=) is off while fields are redacted: it would \
                 confirm a hidden value; use the failure groups (error_class=)"
                    .into(),
            ));
        }
        if let Some(class) = &self.error_class {
            if !redaction.shapes().is_clean(class) {
                return Err(Failure::BadRequest(
                    "this error class holds redacted text: take a group's link from the \
                     failures page"
                        .into(),
                ));
            }
        }
        let status = self
            .status
            .as_deref()
            .filter(|s| *s != "any")
            .map(|s| s.parse::<MessageStatus>())
            .transpose()?;
        Ok(MessageFilter {
            status,
            destination: self.destination.clone(),
            since: self.since.as_deref().map(time_bound).transpose()?,
            until: self.until.as_deref().map(time_bound).transpose()?,
            downstream_key: self.key.clone(),
            ordering_key: self.ordering_key.clone(),
            error_contains: self.error.clone(),
            error_class: self.error_class.clone(),
            ..MessageFilter::default()
        })
    }

    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.to_pairs().is_empty()
    }
}

/// Refuses text Postgres cannot take (a NUL byte), before it becomes a database error.
/// The first value of field `name` in a form or query string's pairs.
pub(crate) fn value<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

pub(crate) fn storable(name: &str, value: &str) -> Result<(), Failure> {
    if value.contains('\0') {
        return Err(Failure::BadRequest(format!("{name} contains a NUL byte")));
    }
    Ok(())
}

/// `30m`, `2h`, `7d` ago, or an RFC 3339 time.
fn time_bound(text: &str) -> Result<TimeBound, Failure> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(TimeBound::At(at.with_timezone(&Utc)));
    }
    humantime::parse_duration(text)
        .ok()
        .filter(|d| *d < Duration::from_secs(100 * 365 * 24 * 3600))
        .map(TimeBound::Ago)
        .ok_or_else(|| {
            Failure::BadRequest(format!(
                "{text:?} is neither a duration ago (30m, 2h, 7d) nor an RFC 3339 time"
            ))
        })
}

/// The page's cursor (`before`) and size (`limit`, at most `max`).
pub(crate) fn page(
    pairs: &[(String, String)],
    default: u64,
    max: u64,
) -> Result<(Option<ListCursor>, u64), Failure> {
    let mut cursor = None;
    let mut limit = default;
    for (name, value) in pairs {
        match name.as_str() {
            "before" if !value.is_empty() => cursor = Some(value.parse()?),
            "limit" if !value.is_empty() => {
                limit = value
                    .parse::<u64>()
                    .map_err(|_| Failure::BadRequest(format!("limit {value:?} is not a number")))?
            }
            _ => {}
        }
    }
    Ok((cursor, limit.clamp(1, max)))
}

/// `text` as one path segment: every byte but the unreserved ones and `:` percent-encoded, so a
/// destination such as `webhook:orders` or `a/b?c` names one segment that the router's `{..}`
/// decodes back.
pub(crate) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `pairs` as a query string.
pub(crate) fn encode<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        out.append_pair(name, value);
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_fields_read_back_what_they_write() {
        let input = b"status=failed&destination=stripe&since=2h&key=&error=card%20declined&x=1";
        let fields = FilterFields::from_pairs(&pairs(input));
        assert_eq!(fields.key, None);
        assert_eq!(fields.error.as_deref(), Some("card declined"));
        let again = FilterFields::from_pairs(&pairs(encode(fields.to_pairs()).as_bytes()));
        assert_eq!(again, fields);
        let filter = fields.filter(&Redaction::default()).expect("filter");
        assert_eq!(filter.status, Some(MessageStatus::Failed));
        assert_eq!(
            filter.since,
            Some(TimeBound::Ago(Duration::from_secs(7200)))
        );
    }

    #[test]
    fn a_segment_keeps_colons_and_encodes_what_would_end_or_split_it() {
        assert_eq!(segment("webhook:orders"), "webhook:orders");
        assert_eq!(segment("a/b?c#d e%+"), "a%2Fb%3Fc%23d%20e%25%2B");
        assert_eq!(segment("café"), "caf%C3%A9");
        for text in ["a/b?c#d e%+&=", "café", ""] {
            let decoded = pairs(format!("x={}", segment(text)).as_bytes());
            assert_eq!(decoded, vec![("x".to_owned(), text.to_owned())]);
        }
    }

    #[test]
    fn bad_fields_are_errors() {
        for input in [
            &b"status=dead"[..],
            b"since=yesterday",
            b"until=99999999999y",
        ] {
            assert!(FilterFields::from_pairs(&pairs(input))
                .filter(&Redaction::default())
                .is_err());
        }
        assert!(page(&pairs(b"before=nope"), 50, 500).is_err());
        assert!(page(&pairs(b"limit=-1"), 50, 500).is_err());
        assert_eq!(
            page(&pairs(b"limit=9999"), 50, 500).ok().map(|p| p.1),
            Some(500)
        );
    }
}
