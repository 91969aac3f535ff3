//! Free text (a downstream's error, a receipt, a breaker's reason) scrubbed of what redaction
//! hides: the values the message's own documents hid, when they are at hand, and text shaped
//! like a redacted kind (email addresses when a field name mentions mail; card numbers, 13 to 19
//! digits passing the Luhn check, when one mentions a card). A value of no known shape is found
//! only where its message's documents are read (a message's own page and API answer).

use std::ops::Range;

use super::{Redaction, REDACTED};

/// Values shorter than this (in characters) are hidden in documents but not searched for in free
/// text: they would match everywhere and hide nothing.
const SHORTEST_SCRUBBED: usize = 3;

/// What a message's free text becomes when its documents could not be redacted: what they hold,
/// and so what to scrub, is unknown.
pub(crate) const TEXT_WITHHELD: &str =
    "[withheld: cannot be scrubbed (the message's payload or headers cannot be redacted)]";

/// Scrubs free text for one view: see the module's documentation.
#[derive(Debug)]
pub(crate) struct Scrubber<'a> {
    redaction: &'a Redaction,
    /// The values to hide, lowercased (ASCII), longest first; `None`: withhold every text.
    values: Option<Vec<String>>,
}

impl<'a> Scrubber<'a> {
    pub(super) fn new(redaction: &'a Redaction, values: Option<Vec<String>>) -> Self {
        let values = values.map(|mut v| {
            v.retain(|s| s.chars().count() >= SHORTEST_SCRUBBED);
            v.iter_mut().for_each(|s| s.make_ascii_lowercase());
            v.sort_by_key(|s| std::cmp::Reverse(s.len()));
            v.dedup();
            v
        });
        Self { redaction, values }
    }

    /// `text` with what redaction hides replaced by `[redacted]`; as is without redaction.
    pub fn text(&self, text: &str) -> String {
        if !self.redaction.is_on() {
            return text.to_owned();
        }
        let Some(values) = &self.values else {
            return TEXT_WITHHELD.to_owned();
        };
        let mut hidden = Vec::new();
        // ASCII lowercasing keeps every byte where it was: the ranges index `text` too.
        let lower = text.to_ascii_lowercase();
        for value in values {
            hidden.extend(
                lower
                    .match_indices(value.as_str())
                    .map(|(at, v)| at..at + v.len()),
            );
        }
        if self.redaction.emails {
            hidden.extend(emails(text));
        }
        if self.redaction.cards {
            hidden.extend(card_numbers(text));
        }
        replace(text, hidden)
    }

    /// [`Scrubber::text`] of an optional text.
    pub fn opt(&self, text: Option<&str>) -> Option<String> {
        text.map(|t| self.text(t))
    }

    /// True when `text` holds nothing this scrubber hides.
    pub fn is_clean(&self, text: &str) -> bool {
        self.text(text) == text
    }
}

/// `text` with each run of `hidden` ranges (overlapping or touching) replaced by one
/// [`REDACTED`].
fn replace(text: &str, mut hidden: Vec<Range<usize>>) -> String {
    if hidden.is_empty() {
        return text.to_owned();
    }
    hidden.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    let mut open = false;
    for range in hidden {
        if open && range.start <= at {
            at = at.max(range.end);
            continue;
        }
        out.push_str(&text[at..range.start]);
        out.push_str(REDACTED);
        at = range.end;
        open = true;
    }
    out.push_str(&text[at..]);
    out
}

fn is_local(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._%+-".contains(&b)
}

fn is_domain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b".-".contains(&b)
}

/// Where `text` holds an email address: `[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+`, the shape the
/// failure groups' normalised text replaces by `<email>`.
fn emails(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    for (at, _) in text.match_indices('@') {
        let start = bytes[..at]
            .iter()
            .rposition(|&b| !is_local(b))
            .map_or(0, |p| p + 1);
        let end = bytes[at + 1..]
            .iter()
            .position(|&b| !is_domain(b))
            .map_or(bytes.len(), |p| at + 1 + p);
        if start < at && end > at + 1 {
            found.push(start..end);
        }
    }
    found
}

/// Where `text` holds a card number: 13 to 19 digits passing the Luhn check, in groups split by
/// single spaces or dashes (`4242 4242 4242 4242`, `4242-4242-4242-4242`).
fn card_numbers(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if !bytes[at].is_ascii_digit() {
            at += 1;
            continue;
        }
        // A run of digit groups, each next one after exactly one separator.
        let mut groups: Vec<Range<usize>> = Vec::new();
        let mut start = at;
        loop {
            let end = bytes[start..]
                .iter()
                .position(|b| !b.is_ascii_digit())
                .map_or(bytes.len(), |p| start + p);
            groups.push(start..end);
            let next = end + 1;
            if end < bytes.len()
                && matches!(bytes[end], b' ' | b'-')
                && next < bytes.len()
                && bytes[next].is_ascii_digit()
            {
                start = next;
            } else {
                at = end;
                break;
            }
        }
        found.extend(luhn_spans(bytes, &groups));
    }
    found
}

/// The spans of consecutive `groups` whose digits (13 to 19 of them) pass the Luhn check.
fn luhn_spans(bytes: &[u8], groups: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    for first in 0..groups.len() {
        let mut digits = Vec::new();
        for group in &groups[first..] {
            digits.extend(bytes[group.clone()].iter().map(|b| b - b'0'));
            if digits.len() > 19 {
                break;
            }
            if digits.len() >= 13 && luhn(&digits) {
                found.push(groups[first].start..group.end);
            }
        }
    }
    found
}

fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d);
            if !i.is_multiple_of(2) {
                let twice = d * 2;
                if twice > 9 {
                    twice - 9
                } else {
                    twice
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redaction(fields: &[&str]) -> Redaction {
        Redaction::new(&fields.iter().map(|f| (*f).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn email_addresses_are_scrubbed_when_a_field_mentions_mail() {
        let r = redaction(&["email"]);
        assert_eq!(
            r.shapes()
                .text("550 <alice@example.com> mailbox unavailable"),
            "550 <[redacted]> mailbox unavailable"
        );
        assert_eq!(
            r.shapes().text("a.b+c@x.io, d@y.org"),
            "[redacted], [redacted]"
        );
        assert_eq!(r.shapes().text("no address @ all"), "no address @ all");
        let other = redaction(&["name"]);
        assert_eq!(
            other.shapes().text("550 <alice@example.com>"),
            "550 <alice@example.com>"
        );
    }

    #[test]
    fn card_numbers_are_scrubbed_when_a_field_mentions_a_card() {
        let r = redaction(&["card"]);
        for (text, want) in [
            ("card 4242424242424242 declined", "card [redacted] declined"),
            (
                "card 4242 4242 4242 4242 declined",
                "card [redacted] declined",
            ),
            ("card 4242-4242-4242-4242, 12/30", "card [redacted], 12/30"),
            ("card 4242424242424242 2025", "card [redacted] 2025"),
            (
                "order 1234567890123 (not Luhn)",
                "order 1234567890123 (not Luhn)",
            ),
            ("402 for 4242 at 2025-01-01", "402 for 4242 at 2025-01-01"),
        ] {
            assert_eq!(r.shapes().text(text), want, "{text}");
        }
    }

    #[test]
    fn a_messages_own_hidden_values_are_scrubbed_without_case() {
        let r = redaction(&["name"]);
        let hidden = Some(vec!["Alice Smith".to_owned(), "ab".to_owned()]);
        let s = r.scrubber(&[&hidden]);
        assert_eq!(
            s.text("unknown recipient ALICE SMITH (ab)"),
            "unknown recipient [redacted] (ab)"
        );
    }

    #[test]
    fn a_message_whose_documents_are_withheld_has_its_text_withheld() {
        let r = redaction(&["name"]);
        let s = r.scrubber(&[&Some(vec![]), &None]);
        assert_eq!(s.text("timeout"), TEXT_WITHHELD);
    }

    #[test]
    fn without_redaction_text_is_unchanged() {
        let r = redaction(&[]);
        let s = r.scrubber(&[&None]);
        assert_eq!(s.text("550 <alice@example.com>"), "550 <alice@example.com>");
    }

    #[test]
    fn overlapping_and_adjacent_ranges_become_one_placeholder_each_run() {
        assert_eq!(replace("abcdef", vec![0..3, 2..4]), "[redacted]ef");
        assert_eq!(
            replace("abcdef", vec![4..6, 1..2]),
            "a[redacted]cd[redacted]"
        );
        assert_eq!(replace("héllo", vec![]), "héllo");
    }
}
