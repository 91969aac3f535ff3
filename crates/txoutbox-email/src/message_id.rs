//! The Message-ID rule: one outbox row, one Message-ID, on every attempt.
//!
//! `Message-ID: <{key}@{domain}>`, where `{key}` is the row's downstream key made safe for a
//! msg-id: characters outside RFC 5322 `atext` (and `%` itself) become `%XX`, as do dots that would
//! lead, trail or double. A derived key (a UUID) passes unchanged. The mapping is one-to-one, so two
//! keys never share a Message-ID.

/// The Message-ID of the outbox row with downstream key `key`, as `<{key}@{domain}>`
/// (see the crate docs for the encoding of unusual keys).
///
/// ```
/// assert_eq!(
///     txoutbox_email::message_id("0b8f2c9e-4d1a-5e6f-8a7b-9c0d1e2f3a4b", "example.com"),
///     "<0b8f2c9e-4d1a-5e6f-8a7b-9c0d1e2f3a4b@example.com>"
/// );
/// assert_eq!(txoutbox_email::message_id("digest:2026-12-02", "example.com"),
///            "<digest%3A2026-12-02@example.com>");
/// ```
pub fn message_id(key: &str, domain: &str) -> String {
    format!("<{}@{domain}>", id_left(key))
}

/// The `Idempotency-Key` header value: the key itself when it is visible ASCII (always, for
/// derived keys), else its msg-id encoding.
#[cfg_attr(not(feature = "sink"), allow(dead_code))]
pub(crate) fn idempotency_header(key: &str) -> String {
    if !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic()) {
        key.to_owned()
    } else {
        id_left(key)
    }
}

fn id_left(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = String::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        let literal = if b == b'.' {
            i > 0 && i + 1 < bytes.len() && !out.ends_with('.')
        } else {
            is_atext(b) && b != b'%'
        };
        if literal {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// RFC 5322 `atext`: the characters of a dot-atom besides the dot.
pub(crate) fn is_atext(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~".contains(&b)
}

/// A domain usable as a msg-id's right side: a dot-atom (`mail.example.com`) or a literal
/// (`[192.0.2.1]`), ASCII only.
#[cfg_attr(not(feature = "sink"), allow(dead_code))]
pub(crate) fn check_domain(domain: &str) -> Result<(), String> {
    if domain.is_empty() {
        return Err("it is empty".to_owned());
    }
    if let Some(inner) = domain.strip_prefix('[') {
        let ok = inner.strip_suffix(']').is_some_and(|body| {
            body.bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'[' | b']' | b'\\'))
        });
        return if ok {
            Ok(())
        } else {
            Err("a domain literal is [printable ASCII]".to_owned())
        };
    }
    if !domain.is_ascii() {
        return Err(
            "it is not ASCII (give an ASCII or punycode domain for the Message-ID)".to_owned(),
        );
    }
    let ok = domain
        .split('.')
        .all(|label| !label.is_empty() && label.bytes().all(is_atext));
    if ok {
        Ok(())
    } else {
        Err("it is not a dot-atom (letters, digits and - separated by single dots)".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_key_is_used_as_it_is() {
        let key = "6a1f3c2e-8b4d-4e7a-9c15-2f0b7d3e91a4";
        assert_eq!(
            message_id(key, "shop.example"),
            format!("<{key}@shop.example>")
        );
        assert_eq!(idempotency_header(key), key);
    }

    #[test]
    fn characters_outside_atext_and_dots_a_dot_atom_refuses_are_percent_encoded() {
        for (key, left) in [
            // Characters outside atext.
            ("digest:2026 12", "digest%3A2026%2012"),
            ("a<b>@c\"d", "a%3Cb%3E%40c%22d"),
            ("100%", "100%25"),
            ("é", "%C3%A9"),
            // Dots stay only where a dot-atom allows them.
            ("a.b", "a.b"),
            (".a", "%2Ea"),
            ("a.", "a%2E"),
            ("a..b", "a.%2Eb"),
        ] {
            assert_eq!(id_left(key), left, "{key:?}");
        }
    }

    #[test]
    fn distinct_keys_get_distinct_message_ids() {
        let keys = ["a:b", "a%3Ab", "a.b", "a%2Eb", "a..b", "a.%2Eb", "x", "X"];
        let ids: std::collections::HashSet<_> =
            keys.iter().map(|k| message_id(k, "d.example")).collect();
        assert_eq!(ids.len(), keys.len());
    }

    #[test]
    fn domains_are_checked() {
        for (domain, accepted) in [
            ("mail.example.com", true),
            ("[192.0.2.1]", true),
            ("", false),
            ("a..b", false),
            ("exa mple.com", false),
            ("bücher.example", false),
            ("[1.2.3.4", false),
        ] {
            assert_eq!(check_domain(domain).is_ok(), accepted, "{domain:?}");
        }
    }
}
