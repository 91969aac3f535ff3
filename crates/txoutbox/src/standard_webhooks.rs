//! Standard Webhooks signatures, shared by the sending side (the webhook sink) and the receiving
//! side (the axum receiver): the symmetric `v1` scheme (HMAC-SHA256 over
//! `{webhook-id}.{webhook-timestamp}.{body}`, base64), the `whsec_` secret form, and the
//! receiver's verification (constant-time comparison, a timestamp tolerance against replays,
//! several space-separated signatures, and several secrets, for secret rotation). No HTTP types:
//! a verifier reads the headers through a function, whatever its framework.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The `webhook-id` header: the delivery's downstream key, the same on every attempt.
pub const WEBHOOK_ID: &str = "webhook-id";
/// The `webhook-timestamp` header: unix seconds at the attempt.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// The `webhook-signature` header: `v1,<base64>` (space-separated when there are several).
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// How far a `webhook-timestamp` may be from the receiver's clock (the spec libraries' 5 minutes).
pub const TIMESTAMP_TOLERANCE: Duration = Duration::from_secs(5 * 60);

const SECRET_PREFIX: &str = "whsec_";
const SIGNATURE_VERSION: &str = "v1";

/// A symmetric signing secret, shared by the sender and one endpoint.
#[derive(Clone)]
pub struct WebhookSecret {
    bytes: Vec<u8>,
    // Keyed once: every attempt clones it instead of re-deriving the HMAC key schedule.
    keyed: Hmac<Sha256>,
}

impl PartialEq for WebhookSecret {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for WebhookSecret {}

impl WebhookSecret {
    /// Parses the Standard Webhooks form: `whsec_` followed by base64. As the reference
    /// libraries do, the prefix is optional (a bare base64 string is accepted too).
    pub fn parse(secret: &str) -> Result<Self, SecretError> {
        let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
        let bytes = STANDARD
            .decode(encoded.trim())
            .map_err(|e| SecretError::NotBase64(e.to_string()))?;
        Self::from_bytes(bytes)
    }

    /// A secret given as raw key bytes.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<Self, SecretError> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(SecretError::Empty);
        }
        let keyed =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&bytes).map_err(|_| SecretError::Empty)?;
        Ok(Self { bytes, keyed })
    }

    /// The secret in its `whsec_<base64>` form, as handed to a receiver.
    pub fn to_whsec(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.bytes))
    }

    /// The HMAC state after `{id}.{timestamp}.{body}`.
    fn mac_of(&self, id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key: a Debug of a sink or a config ends up in logs.
        write!(f, "WebhookSecret({} bytes)", self.bytes.len())
    }
}

/// Why a secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The part after `whsec_` is not standard base64.
    #[error("the webhook secret is not base64 (expected whsec_<base64>): {0}")]
    NotBase64(String),
    /// A secret of no bytes signs nothing.
    #[error("the webhook secret is empty")]
    Empty,
}

/// Signs one attempt: returns the `webhook-signature` value, `v1,<base64 HMAC-SHA256>` of
/// `{id}.{timestamp}.{body}`.
pub fn sign(secret: &WebhookSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = secret.mac_of(id, timestamp, body).finalize().into_bytes();
    format!("{SIGNATURE_VERSION},{}", STANDARD.encode(tag))
}

/// Why a received webhook did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A required header is absent (or not visible ASCII).
    #[error("missing or unreadable header {0}")]
    MissingHeader(&'static str),
    /// `webhook-timestamp` is not an integer.
    #[error("webhook-timestamp is not unix seconds")]
    InvalidTimestamp,
    /// The timestamp is older than the tolerance: possibly a replay.
    #[error("webhook-timestamp is too old")]
    TimestampTooOld,
    /// The timestamp is further in the future than the tolerance.
    #[error("webhook-timestamp is too far in the future")]
    TimestampInFuture,
    /// No `v1` signature in the header matches.
    #[error("no webhook signature matches")]
    InvalidSignature,
}

/// Verifies a received webhook as the Standard Webhooks spec publishes the algorithm: the three
/// `webhook-*` headers (read through `header`, which answers a header's value by its lower-case
/// name, or `None` when it is absent or not visible ASCII) must be present, the timestamp within
/// `tolerance` of `now` in both directions, and one of the space-separated `v1,` signatures must
/// equal the HMAC of `{id}.{timestamp}.{body}` under one of `secrets` (compared in constant
/// time; several secrets while one is rotated). `body` is the raw bytes received: re-serialised
/// JSON will not verify.
pub fn verify_with<'h>(
    secrets: &[WebhookSecret],
    header: impl Fn(&'static str) -> Option<&'h str>,
    body: &[u8],
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), VerifyError> {
    let required = |name: &'static str| header(name).ok_or(VerifyError::MissingHeader(name));
    let id = required(WEBHOOK_ID)?;
    let timestamp = required(WEBHOOK_TIMESTAMP)?;
    let signatures = required(WEBHOOK_SIGNATURE)?;
    let timestamp: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::InvalidTimestamp)?;
    let now = unix_seconds(now);
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if now.saturating_sub(timestamp) > tolerance {
        return Err(VerifyError::TimestampTooOld);
    }
    if timestamp.saturating_sub(now) > tolerance {
        return Err(VerifyError::TimestampInFuture);
    }
    let tags: Vec<Vec<u8>> = signatures
        .split(' ')
        .filter_map(|candidate| candidate.split_once(','))
        // v1a (asymmetric) and future schemes are not ours to check
        .filter(|(version, _)| *version == SIGNATURE_VERSION)
        .filter_map(|(_, encoded)| STANDARD.decode(encoded).ok())
        .collect();
    for secret in secrets {
        let mac = secret.mac_of(id, timestamp, body);
        if tags.iter().any(|tag| mac.clone().verify_slice(tag).is_ok()) {
            return Ok(());
        }
    }
    Err(VerifyError::InvalidSignature)
}

/// Unix seconds of `at` (negative before 1970).
pub fn unix_seconds(at: SystemTime) -> i64 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The published test vector of the Standard Webhooks reference libraries
    // (standard-webhooks/standard-webhooks, libraries/rust/src/lib.rs, `test_sign`).
    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TIMESTAMP: i64 = 1649367553;
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    fn secret() -> WebhookSecret {
        WebhookSecret::parse(SECRET).expect("valid secret")
    }

    fn at(ts: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(ts as u64)
    }

    type Headers = Vec<(&'static str, String)>;

    fn headers(id: &str, ts: &str, sig: &str) -> Headers {
        vec![
            (WEBHOOK_ID, id.to_owned()),
            (WEBHOOK_TIMESTAMP, ts.to_owned()),
            (WEBHOOK_SIGNATURE, sig.to_owned()),
        ]
    }

    fn verify_at(
        secret: &WebhookSecret,
        headers: &Headers,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), VerifyError> {
        let header = |name: &'static str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        verify_with(
            std::slice::from_ref(secret),
            header,
            body,
            now,
            TIMESTAMP_TOLERANCE,
        )
    }

    #[test]
    fn signing_matches_the_published_test_vector() {
        assert_eq!(sign(&secret(), ID, TIMESTAMP, BODY), SIGNATURE);
    }

    #[test]
    fn the_published_test_vector_verifies() {
        let h = headers(ID, &TIMESTAMP.to_string(), SIGNATURE);
        assert_eq!(verify_at(&secret(), &h, BODY, at(TIMESTAMP + 10)), Ok(()));
    }

    #[test]
    fn prefix_is_optional_and_raw_bytes_are_accepted() {
        let bare = WebhookSecret::parse("C2FVsBQIhrscChlQIMV+b5sSYspob7oD").expect("valid");
        assert_eq!(bare, secret());
        let raw = STANDARD
            .decode("C2FVsBQIhrscChlQIMV+b5sSYspob7oD")
            .expect("base64");
        let from_raw = WebhookSecret::from_bytes(raw).expect("valid");
        assert_eq!(sign(&from_raw, ID, TIMESTAMP, BODY), SIGNATURE);
        assert_eq!(from_raw.to_whsec(), SECRET);
    }

    #[test]
    fn bad_secrets_are_refused() {
        assert!(matches!(
            WebhookSecret::parse("whsec_not base64!"),
            Err(SecretError::NotBase64(_))
        ));
        assert_eq!(WebhookSecret::parse("whsec_"), Err(SecretError::Empty));
    }

    #[test]
    fn a_changed_body_id_or_timestamp_does_not_verify() {
        let now = at(TIMESTAMP);
        let s = secret();
        let ok = headers(ID, &TIMESTAMP.to_string(), SIGNATURE);
        assert_eq!(
            verify_at(&s, &ok, br#"{"email":"test@example.com"}"#, now),
            Err(VerifyError::InvalidSignature)
        );
        let other_id = headers("msg_other", &TIMESTAMP.to_string(), SIGNATURE);
        assert_eq!(
            verify_at(&s, &other_id, BODY, now),
            Err(VerifyError::InvalidSignature)
        );
        let other_ts = headers(ID, &(TIMESTAMP + 1).to_string(), SIGNATURE);
        assert_eq!(
            verify_at(&s, &other_ts, BODY, now),
            Err(VerifyError::InvalidSignature)
        );
        let other_secret = WebhookSecret::from_bytes(b"another key".to_vec()).expect("valid");
        assert_eq!(
            verify_at(&other_secret, &ok, BODY, now),
            Err(VerifyError::InvalidSignature)
        );
    }

    #[test]
    fn one_matching_signature_among_several_verifies() {
        let list = format!(
            "v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= v1a,c2lnbmF0dXJl {SIGNATURE} v1,notbase64"
        );
        let h = headers(ID, &TIMESTAMP.to_string(), &list);
        assert_eq!(verify_at(&secret(), &h, BODY, at(TIMESTAMP)), Ok(()));
        let none = headers(
            ID,
            &TIMESTAMP.to_string(),
            "v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q=",
        );
        assert_eq!(
            verify_at(&secret(), &none, BODY, at(TIMESTAMP)),
            Err(VerifyError::InvalidSignature)
        );
    }

    #[test]
    fn timestamps_outside_the_tolerance_are_refused() {
        let h = headers(ID, &TIMESTAMP.to_string(), SIGNATURE);
        let tolerance = TIMESTAMP_TOLERANCE.as_secs() as i64;
        assert_eq!(
            verify_at(&secret(), &h, BODY, at(TIMESTAMP + tolerance + 1)),
            Err(VerifyError::TimestampTooOld)
        );
        assert_eq!(
            verify_at(&secret(), &h, BODY, at(TIMESTAMP - tolerance - 1)),
            Err(VerifyError::TimestampInFuture)
        );
        assert_eq!(
            verify_at(&secret(), &h, BODY, at(TIMESTAMP + tolerance)),
            Ok(())
        );
    }

    #[test]
    fn missing_headers_are_named() {
        let mut h = headers(ID, &TIMESTAMP.to_string(), SIGNATURE);
        h.retain(|(n, _)| *n != WEBHOOK_SIGNATURE);
        assert_eq!(
            verify_at(&secret(), &h, BODY, at(TIMESTAMP)),
            Err(VerifyError::MissingHeader(WEBHOOK_SIGNATURE))
        );
        let h = headers(ID, "yesterday", SIGNATURE);
        assert_eq!(
            verify_at(&secret(), &h, BODY, at(TIMESTAMP)),
            Err(VerifyError::InvalidTimestamp)
        );
    }

    #[test]
    fn a_rotated_secret_verifies_under_either_of_the_configured_secrets() {
        let old = secret();
        let new = WebhookSecret::from_bytes(b"the new key".to_vec()).expect("valid");
        let h = headers(ID, &TIMESTAMP.to_string(), SIGNATURE);
        let header =
            |name: &'static str| h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
        let both = [new.clone(), old];
        assert_eq!(
            verify_with(&both, header, BODY, at(TIMESTAMP), TIMESTAMP_TOLERANCE),
            Ok(())
        );
        assert_eq!(
            verify_with(&[new], header, BODY, at(TIMESTAMP), TIMESTAMP_TOLERANCE),
            Err(VerifyError::InvalidSignature)
        );
    }

    #[test]
    fn the_secret_is_not_printed() {
        assert!(!format!("{:?}", secret()).contains("C2FV"));
    }
}
