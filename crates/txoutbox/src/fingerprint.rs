//! What makes two requests "the same": a retry must repeat the request it retries, else it is a
//! client bug answered with 422, not a replay.
//!
//! The fingerprint is SHA-256 over the upper-cased method, the route and the canonical body:
//! - the route is compared as given; pass the route template (`/orders/{id}`) plus the path
//!   parameters in the body, or the concrete path, but the same form on every call;
//! - a body that parses as JSON is compared as JSON: object key order and insignificant whitespace
//!   do not matter; strings, numbers (`1` and `1.0` differ) and array order do;
//! - any other body is compared byte for byte; headers are not part of the fingerprint.

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

/// JSON bodies re-serialised with sorted keys and no whitespace; other bodies as they are.
fn canonical_body(body: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    // serde_json's map is a BTreeMap (no `preserve_order`), so serialising sorts the keys.
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) => match serde_json::to_vec(&value) {
            Ok(bytes) => std::borrow::Cow::Owned(bytes),
            Err(_) => std::borrow::Cow::Borrowed(body),
        },
        Err(_) => std::borrow::Cow::Borrowed(body),
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
    fn round_trips_through_bytes() {
        let a = Fingerprint::new("POST", "/x", b"");
        assert_eq!(Fingerprint::from_bytes(a.as_bytes()), Some(a));
        assert_eq!(Fingerprint::from_bytes(&[1, 2, 3]), None);
    }
}
