//! Standard Webhooks signatures: the scheme is the core's ([`txoutbox::standard_webhooks`],
//! shared with the receiving side); this adds the verification of an `http` header map.

use std::time::SystemTime;

use http::HeaderMap;
pub use txoutbox::standard_webhooks::{
    sign, SecretError, VerifyError, WebhookSecret, TIMESTAMP_TOLERANCE, WEBHOOK_ID,
    WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP,
};

/// Verifies a received webhook against the receiver's clock, as the Standard Webhooks spec
/// publishes the algorithm: the three `webhook-*` headers must be present, the timestamp within
/// [`TIMESTAMP_TOLERANCE`] of now, and one of the space-separated `v1,` signatures must equal
/// the HMAC of `{id}.{timestamp}.{body}` (compared in constant time). `body` is the raw bytes
/// received: re-serialised JSON will not verify.
pub fn verify(secret: &WebhookSecret, headers: &HeaderMap, body: &[u8]) -> Result<(), VerifyError> {
    verify_at(secret, headers, body, SystemTime::now())
}

/// [`verify`] against a given clock (for tests and for replaying stored requests).
pub fn verify_at(
    secret: &WebhookSecret,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    txoutbox::standard_webhooks::verify_with(
        std::slice::from_ref(secret),
        |name| headers.get(name).and_then(|v| v.to_str().ok()),
        body,
        now,
        TIMESTAMP_TOLERANCE,
    )
}
