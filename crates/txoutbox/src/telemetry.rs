//! Metrics and trace context.
//!
//! The core records through the [`metrics`] facade only: with no recorder installed every
//! `counter!`/`histogram!`/`gauge!` is a no-op, and the process that wants Prometheus (the
//! `txoutbox relay` command, or a service) installs an exporter and calls [`describe_metrics`].
//!
//! Trace context is the W3C `traceparent` header carried in an outbox row's headers: captured at
//! enqueue ([`crate::OutboxMessage::with_traceparent`], [`crate::Claim::with_traceparent`]),
//! recorded on the relay's delivery span as `trace_id`, and forwarded by the sinks that speak HTTP.

use std::collections::BTreeMap;
use std::fmt;

use crate::{Error, Result};

/// Rows written to the outbox, by `destination` (counted when the insert runs in the caller's
/// transaction; a transaction rolled back afterwards still counted).
pub const ENQUEUED: &str = "txoutbox_messages_enqueued_total";
/// Rows delivered (completion written), by `destination`.
pub const DELIVERED: &str = "txoutbox_messages_delivered_total";
/// Failed attempts scheduled for another try, by `destination`.
pub const RETRIED: &str = "txoutbox_delivery_retries_total";
/// Rows given up on (`failed`), by `destination`.
pub const DEAD_LETTERED: &str = "txoutbox_messages_dead_lettered_total";
/// Seconds from a row's `created_at` (its transaction) to its delivery, by `destination`.
pub const DELIVERY_LATENCY: &str = "txoutbox_delivery_latency_seconds";
/// Seconds one sink call took, by `destination` and `outcome` (delivered, retry, failed).
pub const ATTEMPT_DURATION: &str = "txoutbox_attempt_duration_seconds";
/// Pending rows (due or waiting for their retry), sampled by the relay.
pub const PENDING: &str = "txoutbox_pending_messages";
/// How long the longest-waiting due pending row has been due, sampled by the relay (0 when none).
pub const OLDEST_PENDING_AGE: &str = "txoutbox_oldest_pending_age_seconds";
/// Requests answered with the stored response of an earlier one, by `scope`.
pub const IDEMPOTENCY_REPLAYS: &str = "txoutbox_idempotency_replays_total";
/// Keys reused for a different request (422), by `scope`.
pub const IDEMPOTENCY_MISMATCHES: &str = "txoutbox_idempotency_mismatches_total";
/// Keys held by a concurrent request (409), by `scope`.
pub const IDEMPOTENCY_CONFLICTS: &str = "txoutbox_idempotency_conflicts_total";
/// Rows whose lease expired and that a relay took back.
pub const LEASES_RECLAIMED: &str = "txoutbox_leases_reclaimed_total";

/// Every metric name the core records, for exporters that want to configure them.
pub const ALL: [&str; 12] = [
    ENQUEUED,
    DELIVERED,
    RETRIED,
    DEAD_LETTERED,
    DELIVERY_LATENCY,
    ATTEMPT_DURATION,
    PENDING,
    OLDEST_PENDING_AGE,
    IDEMPOTENCY_REPLAYS,
    IDEMPOTENCY_MISMATCHES,
    IDEMPOTENCY_CONFLICTS,
    LEASES_RECLAIMED,
];

/// Registers the help text and units of every txoutbox metric with the installed recorder.
/// Call it once, after installing the recorder (before, the descriptions go nowhere).
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        ENQUEUED,
        Unit::Count,
        "Outbox rows written, by destination (counted when the insert runs)"
    );
    describe_counter!(
        DELIVERED,
        Unit::Count,
        "Outbox rows delivered, by destination"
    );
    describe_counter!(
        RETRIED,
        Unit::Count,
        "Failed delivery attempts scheduled for a retry, by destination"
    );
    describe_counter!(
        DEAD_LETTERED,
        Unit::Count,
        "Outbox rows dead-lettered (status failed), by destination"
    );
    describe_histogram!(
        DELIVERY_LATENCY,
        Unit::Seconds,
        "Time from a row's enqueue (its transaction) to its delivery, by destination"
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "Duration of one sink call, by destination and outcome"
    );
    describe_gauge!(
        PENDING,
        Unit::Count,
        "Pending outbox rows (due or waiting for a retry), sampled by the relay"
    );
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "How long the longest-waiting due pending row has been due (0 when none), sampled by the relay"
    );
    describe_counter!(
        IDEMPOTENCY_REPLAYS,
        Unit::Count,
        "Requests answered with a stored response, by scope"
    );
    describe_counter!(
        IDEMPOTENCY_MISMATCHES,
        Unit::Count,
        "Idempotency keys reused for a different request (422), by scope"
    );
    describe_counter!(
        IDEMPOTENCY_CONFLICTS,
        Unit::Count,
        "Idempotency keys held by a concurrent request (409), by scope"
    );
    describe_counter!(
        LEASES_RECLAIMED,
        Unit::Count,
        "Outbox rows whose lease expired and were taken back"
    );
}

/// The W3C trace-context header name.
pub const TRACEPARENT: &str = "traceparent";

/// A validated W3C `traceparent` value (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Traceparent(String);

impl Traceparent {
    /// Parses a `traceparent` header value per W3C Trace Context level 1: lower-case hex, a
    /// version other than `ff`, non-zero trace and parent ids; a future version may append fields
    /// after a `-`, version `00` may not.
    pub fn parse(value: &str) -> Result<Self> {
        let invalid = |why: &str| Error::Invalid(format!("traceparent {value:?}: {why}"));
        let bytes = value.as_bytes();
        if bytes.len() < 55 {
            return Err(invalid("too short (version-traceid-parentid-flags)"));
        }
        let hex = |range: std::ops::Range<usize>| {
            bytes[range]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        };
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return Err(invalid("fields must be separated by '-'"));
        }
        if !(hex(0..2) && hex(3..35) && hex(36..52) && hex(53..55)) {
            return Err(invalid("fields must be lower-case hex"));
        }
        let version = &value[0..2];
        if version == "ff" {
            return Err(invalid("version ff is invalid"));
        }
        if version == "00" && bytes.len() != 55 {
            return Err(invalid("version 00 has exactly four fields"));
        }
        if bytes.len() > 55 && bytes[55] != b'-' {
            return Err(invalid("trailing data must follow a '-'"));
        }
        if value[3..35].bytes().all(|b| b == b'0') {
            return Err(invalid("the trace id is all zeros"));
        }
        if value[36..52].bytes().all(|b| b == b'0') {
            return Err(invalid("the parent id is all zeros"));
        }
        Ok(Self(value.to_owned()))
    }

    /// The 32-hex-digit trace id.
    pub fn trace_id(&self) -> &str {
        &self.0[3..35]
    }

    /// The 16-hex-digit parent (span) id.
    pub fn parent_id(&self) -> &str {
        &self.0[36..52]
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Traceparent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The trace id of a delivery's `traceparent` header, when it carries a valid one.
pub fn trace_id(headers: &BTreeMap<String, String>) -> Option<String> {
    headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT))
        .and_then(|(_, value)| Traceparent::parse(value.trim()).ok())
        .map(|t| t.trace_id().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_yields_its_ids() {
        let t = Traceparent::parse(VALID).expect("valid");
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert_eq!(t.as_str(), VALID);
    }

    #[test]
    fn malformed_traceparents_are_rejected() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert!(Traceparent::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(Traceparent::parse(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        )
        .is_ok());
    }

    #[test]
    fn trace_id_reads_the_header_case_insensitively() {
        let mut headers = BTreeMap::new();
        headers.insert("Traceparent".to_owned(), VALID.to_owned());
        assert_eq!(
            trace_id(&headers).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        headers.insert("Traceparent".to_owned(), "garbage".to_owned());
        assert_eq!(trace_id(&headers), None);
    }
}
