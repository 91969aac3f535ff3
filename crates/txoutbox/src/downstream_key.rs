//! Downstream keys: the key a downstream deduplicates an effect's deliveries on. Derived from a
//! caller's own key ([`derive_downstream_key`]) or from a claim of a request's key
//! ([`derive_claim_downstream_key`]), or given by the caller and checked
//! ([`check_downstream_key`]); an operator's replay with a new key gets
//! [`replay_downstream_key`].

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::key::IdempotencyKey;

/// The namespace of derived downstream keys (a fixed UUID of this project).
pub const DOWNSTREAM_KEY_NAMESPACE: Uuid =
    Uuid::from_u128(0x6a1f_3c2e_8b4d_4e7a_9c15_2f0b_7d3e_91a4);

/// Derives a downstream key from a key of the caller's own (a batch job's run id, say):
/// `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "{scope}\n{key}\n{effect}")`, as a hyphenated lower-case UUID.
///
/// The same (scope, key, effect) always gives the same key, on every host and every version;
/// two effects give two keys. Effects enqueued on a [`crate::idempotency::Claim`] get keys that also depend on
/// the claim, so that a key reused after its window makes new effects
/// ([`crate::idempotency::Claim::downstream_key`] tells them). Scope and effect names contain no newline (they are
/// validated) and keys are visible ASCII, so the joined name is unambiguous.
pub fn derive_downstream_key(scope: &str, key: &IdempotencyKey, effect: &str) -> String {
    let name = format!("{scope}\n{}\n{effect}", key.as_str());
    Uuid::new_v5(&DOWNSTREAM_KEY_NAMESPACE, name.as_bytes()).to_string()
}

/// The downstream key of one effect of one claim of a request's key:
/// `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "{scope}\n{key}\n{effect}\n{claimed_at}")`, where
/// `claimed_at` is the claim's time in microseconds since the Unix epoch (the key row's
/// `created_at`), in decimal.
///
/// Every attempt of the effect carries the key stored with its row, so retries and redeliveries
/// within the key's window carry the same key. A request with the same key after the window is a
/// new claim with a new time, so its effects get new keys: they are new effects, and the outbox
/// (which deduplicates on the key) and the downstream (which would answer the old effect) must
/// not take them for the old ones.
pub(crate) fn derive_claim_downstream_key(
    scope: &str,
    key: &IdempotencyKey,
    claimed_at_micros: i64,
    effect: &str,
) -> String {
    let name = format!("{scope}\n{}\n{effect}\n{claimed_at_micros}", key.as_str());
    Uuid::new_v5(&DOWNSTREAM_KEY_NAMESPACE, name.as_bytes()).to_string()
}

/// Downstream keys are forwarded as HTTP headers and Message-IDs: the key alphabet applies.
pub(crate) fn check_downstream_key(key: &str) -> Result<()> {
    IdempotencyKey::parse(key)
        .map(|_| ())
        .map_err(|e| Error::Invalid(format!("downstream key: {e}")))
}

/// The key a replay with a new key gives a message now carrying `current`:
/// `UUIDv5(DOWNSTREAM_KEY_NAMESPACE, "replay\n{id}\n{current}")`, hyphenated lower case.
///
/// Deterministic (a dry run shows the key the replay will use) and unique: it depends on the key
/// being replaced, so each replay with a new key gives the message a key it never had.
pub fn replay_downstream_key(id: Uuid, current: &str) -> String {
    Uuid::new_v5(
        &DOWNSTREAM_KEY_NAMESPACE,
        format!("replay\n{id}\n{current}").as_bytes(),
    )
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_are_deterministic_and_distinct_per_effect() {
        let key = IdempotencyKey::parse("k-1").expect("valid");
        let a = derive_downstream_key("charges", &key, "stripe");
        assert_eq!(a, derive_downstream_key("charges", &key, "stripe"));
        assert_ne!(a, derive_downstream_key("charges", &key, "email"));
        assert_ne!(a, derive_downstream_key("refunds", &key, "stripe"));
        // The documented rule, spelled out.
        let expected = Uuid::new_v5(&DOWNSTREAM_KEY_NAMESPACE, b"charges\nk-1\nstripe").to_string();
        assert_eq!(a, expected);
    }

    #[test]
    fn claim_keys_differ_per_claim_time_and_follow_the_documented_rule() {
        let key = IdempotencyKey::parse("k-1").expect("valid");
        let first = derive_claim_downstream_key("charges", &key, 1_764_000_000_000_001, "stripe");
        let later = derive_claim_downstream_key("charges", &key, 1_764_086_400_000_002, "stripe");
        assert_ne!(first, later, "a new claim of the key gets new keys");
        assert_ne!(
            first,
            derive_claim_downstream_key("charges", &key, 1_764_000_000_000_001, "email")
        );
        let expected = Uuid::new_v5(
            &DOWNSTREAM_KEY_NAMESPACE,
            b"charges\nk-1\nstripe\n1764000000000001",
        )
        .to_string();
        assert_eq!(first, expected);
    }
}
