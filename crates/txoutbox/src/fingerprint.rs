//! What makes two requests "the same": a retry must repeat the request it retries, else it is a
//! client bug answered with 422, not a replay.
//!
//! The fingerprint is SHA-256 over the upper-cased method, the route and the canonical body:
//! - the route is compared as given; pass the route template (`/orders/{id}`) plus the path
//!   parameters in the body, or the concrete path, but the same form on every call;
//! - a body that parses as JSON is compared as JSON: object key order and insignificant whitespace
//!   do not matter, nor how a string is escaped (`"\u0041"` is `"A"`); strings, array order and
//!   numbers as written do: a number is compared by its text, digit for digit, never through a
//!   float (`1` and `1.0` differ, and so do `0.1` and `0.10000000000000001`);
//! - a JSON object with a duplicate key (`{"a":1,"a":2}`) is not canonicalized: which value counts
//!   depends on the reader, so such a body is compared byte for byte, like any body that is not
//!   JSON (it never matches the same body without the duplicate);
//! - any other body is compared byte for byte; headers are not part of the fingerprint.
//!
//! The canonical form is the one `serde_json` writes for the same value (sorted keys, no
//! whitespace, its string escapes), except that numbers keep their text: fingerprints of bodies
//! without fractions or exponents are the ones earlier versions stored.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

/// A request fingerprint (32 bytes of SHA-256).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Fingerprints a request from its method, route and body bytes (see the module docs).
    pub fn new(method: &str, route: &str, body: &[u8]) -> Self {
        let canonical = canonical_body(body);
        let mut hash = Sha256::new();
        hash.update(method.to_ascii_uppercase().as_bytes());
        hash.update(b"\n");
        hash.update(route.as_bytes());
        hash.update(b"\n");
        hash.update(&canonical);
        Self(hash.finalize().into())
    }

    /// Builds a fingerprint from stored bytes; `None` unless there are exactly 32.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The 32 hash bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// A JSON body in canonical form; any other body (duplicate keys included) as it is.
fn canonical_body(body: &[u8]) -> Cow<'_, [u8]> {
    match canonical_json(body) {
        Some(bytes) => Cow::Owned(bytes),
        None => Cow::Borrowed(body),
    }
}

/// Deeper nesting is not canonicalized (serde_json's own limit): the body compares byte for byte.
const MAX_DEPTH: usize = 128;

/// The canonical form of a JSON text (RFC 8259), or `None` when `body` is not exactly one JSON
/// value, nests deeper than [`MAX_DEPTH`], or has an object with a duplicate key.
fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    let mut parser = Parser { text: body, at: 0 };
    parser.skip_whitespace();
    let value = parser.value(0)?;
    parser.skip_whitespace();
    if parser.at != body.len() {
        return None;
    }
    let mut out = Vec::with_capacity(body.len());
    value.write(&mut out);
    Some(out)
}

/// A parsed JSON value; numbers keep the text they were sent as.
enum Json<'a> {
    Literal(&'static [u8]),
    Number(&'a [u8]),
    String(String),
    Array(Vec<Json<'a>>),
    /// Members sorted by key (byte order of the UTF-8, as serde_json's map), keys unique.
    Object(Vec<(String, Json<'a>)>),
}

impl Json<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Json::Literal(text) | Json::Number(text) => out.extend_from_slice(text),
            Json::String(s) => write_string(s, out),
            Json::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Json::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(key, out);
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

/// A string as serde_json writes it: `"` and `\` escaped, control characters as `\n`-style
/// escapes or `\u00xx`, everything else as UTF-8.
fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &byte in s.as_bytes() {
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x00..=0x1f => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 0xf)],
            ]),
            _ => out.push(byte),
        }
    }
    out.push(b'"');
}

/// A strict recursive-descent reader of RFC 8259 JSON. Every method returns `None` for input
/// that is not JSON; none panics.
struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Option<Json<'a>> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(Json::String),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Option<Json<'a>> {
        let end = self.at.checked_add(word.len())?;
        (self.text.get(self.at..end)? == word).then_some(())?;
        self.at = end;
        Some(Json::Literal(word))
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, kept as text.
    fn number(&mut self) -> Option<Json<'a>> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.one_or_more_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.one_or_more_digits()?;
        }
        Some(Json::Number(self.text.get(start..self.at)?))
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    fn string(&mut self) -> Option<String> {
        self.eat(b'"')?;
        let mut bytes = Vec::new();
        loop {
            match self.next()? {
                b'"' => break,
                b'\\' => {
                    let decoded = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.escaped_char()?,
                        _ => return None,
                    };
                    let mut buf = [0; 4];
                    bytes.extend_from_slice(decoded.encode_utf8(&mut buf).as_bytes());
                }
                0x00..=0x1f => return None,
                byte => bytes.push(byte),
            }
        }
        // Raw bytes are checked here, all at once: invalid UTF-8 is not JSON.
        String::from_utf8(bytes).ok()
    }

    /// The character of a `\uXXXX` escape (after the `u`), a surrogate pair included; a lone
    /// surrogate is not a character, so not JSON.
    fn escaped_char(&mut self) -> Option<char> {
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                self.eat(b'\\')?;
                self.eat(b'u')?;
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return None;
                }
                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
            }
            0xdc00..=0xdfff => return None,
            code => code,
        };
        char::from_u32(code)
    }

    fn hex4(&mut self) -> Option<u32> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = char::from(self.next()?).to_digit(16)?;
            code = code * 16 + digit;
        }
        Some(code)
    }

    /// The items of an array or the members of an object: `open`, then `item`s (each between
    /// white space) separated by commas, then `close`; `None` past [`MAX_DEPTH`] or at anything
    /// else.
    fn sequence<T>(
        &mut self,
        depth: usize,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(open)?;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(close) {
            self.at += 1;
            return Some(items);
        }
        loop {
            self.skip_whitespace();
            items.push(item(self)?);
            self.skip_whitespace();
            match self.next()? {
                b',' => continue,
                c if c == close => return Some(items),
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<Json<'a>> {
        let items = self.sequence(depth, b'[', b']', |p| p.value(depth))?;
        Some(Json::Array(items))
    }

    fn object(&mut self, depth: usize) -> Option<Json<'a>> {
        let mut members = self.sequence(depth, b'{', b'}', |p| {
            let key = p.string()?;
            p.skip_whitespace();
            p.eat(b':')?;
            p.skip_whitespace();
            Some((key, p.value(depth)?))
        })?;
        members.sort_by(|a, b| a.0.cmp(&b.0));
        // A duplicate key: the body is not canonicalized (see the module docs).
        if members.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return None;
        }
        Some(Json::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_key_order_and_whitespace_do_not_matter() {
        let a = Fingerprint::new("POST", "/charge", br#"{"amount":100,"currency":"eur"}"#);
        let b = Fingerprint::new(
            "post",
            "/charge",
            b"{ \"currency\": \"eur\",\n  \"amount\": 100 }",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn other_values_route_or_method_differ() {
        let a = Fingerprint::new("POST", "/charge", br#"{"amount":100}"#);
        assert_ne!(a, Fingerprint::new("POST", "/charge", br#"{"amount":101}"#));
        assert_ne!(a, Fingerprint::new("POST", "/refund", br#"{"amount":100}"#));
        assert_ne!(a, Fingerprint::new("PUT", "/charge", br#"{"amount":100}"#));
        assert_ne!(
            a,
            Fingerprint::new("POST", "/charge", br#"{"amount":100.0}"#)
        );
    }

    #[test]
    fn non_json_bodies_compare_bytes() {
        let a = Fingerprint::new("POST", "/upload", b"a=1&b=2");
        assert_eq!(a, Fingerprint::new("POST", "/upload", b"a=1&b=2"));
        assert_ne!(a, Fingerprint::new("POST", "/upload", b"b=2&a=1"));
    }

    #[test]
    fn integers_beyond_a_float_differ() {
        let a = Fingerprint::new("POST", "/charge", br#"{"amount":18446744073709551616}"#);
        let b = Fingerprint::new("POST", "/charge", br#"{"amount":18446744073709551617}"#);
        assert_ne!(a, b);
        let c = Fingerprint::new("POST", "/charge", br#"{"amount":9007199254740993}"#);
        let d = Fingerprint::new("POST", "/charge", br#"{"amount":9007199254740992}"#);
        assert_ne!(c, d);
    }

    #[test]
    fn decimals_that_round_to_the_same_float_differ() {
        let a = Fingerprint::new("POST", "/rate", br#"{"rate":0.1}"#);
        let b = Fingerprint::new("POST", "/rate", br#"{"rate":0.10000000000000001}"#);
        assert_ne!(a, b);
        assert_ne!(
            Fingerprint::new("POST", "/rate", br#"[1e2]"#),
            Fingerprint::new("POST", "/rate", br#"[100.0]"#)
        );
    }

    #[test]
    fn a_body_with_a_duplicate_key_never_matches_the_body_without_it() {
        let without = Fingerprint::new("POST", "/charge", br#"{"amount":2}"#);
        for duplicated in [
            br#"{"amount":1,"amount":2}"#.as_slice(),
            br#"{"amount":2,"amount":2}"#,
            br#"{"amount":1,"\u0061mount":2}"#,
            br#"{"x":{"amount":1,"amount":2}}"#,
        ] {
            assert_ne!(
                Fingerprint::new("POST", "/charge", duplicated),
                without,
                "{}",
                String::from_utf8_lossy(duplicated)
            );
            // Such a body is compared byte for byte: the same bytes are the same request.
            assert_eq!(
                Fingerprint::new("POST", "/charge", duplicated),
                Fingerprint::new("POST", "/charge", duplicated)
            );
        }
        assert_eq!(canonical_json(br#"{"amount":1,"amount":2}"#), None);
    }

    #[test]
    fn string_escapes_do_not_matter_but_string_content_does() {
        let a = Fingerprint::new("POST", "/x", br#"{"name":"A\/\u00e9\ud83d\ude00"}"#);
        let b = Fingerprint::new("POST", "/x", "{\"name\":\"A/\u{e9}\u{1f600}\"}".as_bytes());
        assert_eq!(a, b);
        assert_ne!(a, Fingerprint::new("POST", "/x", br#"{"name":"a/\u00e9"}"#));
    }

    #[test]
    fn the_canonical_form_is_serde_jsons_for_bodies_without_fractions() {
        // Fingerprints stored by earlier versions (serde_json round trip) still match.
        for body in [
            br#"{"b":1,"a":[true,false,null,{"z":"\"\\\n\t\r\b\f\u0001\u001f\u007f"}]}"#.as_slice(),
            br#"  [ -12 , 0, 18446744073709551615, -9223372036854775808 ] "#,
            "{\"\u{e9}\":\"\u{1f600}\",\"e\":\"\",\"E\":{}}".as_bytes(),
            br#""just a string""#,
            b"42",
            br#"{"amount":1500,"currency":"eur","customer_id":"cus_1","email":"a@b.c"}"#,
        ] {
            let ours = canonical_json(body).expect("valid JSON");
            let value: serde_json::Value = serde_json::from_slice(body).expect("valid JSON");
            let theirs = serde_json::to_vec(&value).expect("serialises");
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs)
            );
        }
    }

    #[test]
    fn what_is_not_json_compares_bytes_without_panicking() {
        let nested_too_deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        for body in [
            b"{".as_slice(),
            br#"{"a":1} x"#,
            br#"{"a":01}"#,
            br#"{"a":1.}"#,
            br#"{"a":-}"#,
            br#"{"a":1e}"#,
            br#"["\ud800"]"#,
            br#"["\udc00\ud800"]"#,
            br#"["\x"]"#,
            b"[\"\x01\"]",
            b"[\"\xff\"]",
            br#"[1,]"#,
            br#"{"a" 1}"#,
            br#"tru"#,
            b"",
            nested_too_deep.as_bytes(),
        ] {
            assert_eq!(
                canonical_json(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let a = Fingerprint::new("POST", "/x", nested_too_deep.as_bytes());
        assert_eq!(
            a,
            Fingerprint::new("POST", "/x", nested_too_deep.as_bytes())
        );
    }

    #[test]
    fn round_trips_through_bytes() {
        let a = Fingerprint::new("POST", "/x", b"");
        assert_eq!(Fingerprint::from_bytes(a.as_bytes()), Some(a));
        assert_eq!(Fingerprint::from_bytes(&[1, 2, 3]), None);
    }
}
