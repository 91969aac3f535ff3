//! Metrics and trace context.
//!
//! The core records through the [`metrics`] facade only: with no recorder installed every
//! `counter!`/`histogram!`/`gauge!` is a no-op, and the process that wants Prometheus (the
//! `txoutbox relay` command, or a service) installs an exporter and calls [`describe_metrics`].
//!
//! Trace context is the W3C `traceparent` header carried in an outbox row's headers: captured at
//! enqueue ([`crate::outbox::OutboxMessage::with_traceparent`], [`crate::idempotency::Claim::with_traceparent`]) and
//! continued by the relay: each delivery attempt is a child span of the stored context (same
//! trace id, its own span id, recorded on the attempt's `delivery` span as `trace_id`, `span_id`
//! and `parent_span_id`), and the attempt's context is what the sinks that speak HTTP forward.
//! The `otel` feature makes the attempt's `tracing` span the OpenTelemetry span of that context,
//! for export by a `tracing-opentelemetry` layer the process installs.
//!
//! Logs: the `logging` feature adds [`logs`], the log output txoutbox's own binaries install
//! (text or JSON lines on standard error); a service with a subscriber of its own leaves it off.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU64;

use crate::error::{Error, Result};

#[cfg(feature = "logging")]
pub mod logs;

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

/// A destination's flow-control state, by `destination` and `state` (`closed`, `open`,
/// `half_open`, `paused`): 1 for the state it is in, 0 for the others.
pub const DESTINATION_STATE: &str = "txoutbox_destination_state";
/// Tokens left in a rate-limited destination's bucket after the relay's last claim, by
/// `destination`.
pub const DESTINATION_TOKENS: &str = "txoutbox_destination_tokens";
/// Claims in which a destination's due rows were held back (paused, open, out of tokens or of
/// in-flight room), by `destination`.
pub const DESTINATION_THROTTLED: &str = "txoutbox_destination_throttled_total";

/// Relays alive (a heartbeat within three of their intervals, the reporting relay included), as
/// the relay's last heartbeat found them in `txoutbox_relays`.
pub const RELAYS_ALIVE: &str = "txoutbox_relays_alive";

/// Every metric name the core records, for exporters that want to configure them.
pub const ALL: [&str; 16] = [
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
    DESTINATION_STATE,
    DESTINATION_TOKENS,
    DESTINATION_THROTTLED,
    RELAYS_ALIVE,
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
    describe_gauge!(
        DESTINATION_STATE,
        Unit::Count,
        "A destination's flow-control state (closed, open, half_open, paused): 1 for the current one"
    );
    describe_gauge!(
        DESTINATION_TOKENS,
        Unit::Count,
        "Tokens left in a rate-limited destination's bucket after the last claim"
    );
    describe_counter!(
        DESTINATION_THROTTLED,
        Unit::Count,
        "Claims in which a destination's rows were held back by flow control"
    );
    describe_gauge!(
        RELAYS_ALIVE,
        Unit::Count,
        "Relays whose heartbeat is under three intervals old (this one included), as its last heartbeat saw them"
    );
}

/// The outcomes [`ATTEMPT_DURATION`] is labelled with.
pub const ATTEMPT_OUTCOMES: [&str; 4] = ["delivered", "retry", "failed", "unknown"];

/// Makes every relay series exist from now on, at 0 until its first event, for these
/// destinations: the counters and histograms labelled by `destination` (every attempt outcome
/// of [`ATTEMPT_DURATION`]), [`LEASES_RECLAIMED`] and the backlog gauges. A series that is absent
/// until its first event breaks `rate()` over its first increase and "absent" alerts; a series
/// at 0 does not. Existing values are not touched (counters are incremented by 0).
///
/// [`crate::relay::Relay::run`] calls it with the destinations of its sinks; a service that enqueues
/// to destinations no local relay serves may call it for [`ENQUEUED`]'s sake. Call it after
/// installing the recorder.
pub fn register_destinations<S: AsRef<str>>(destinations: impl IntoIterator<Item = S>) {
    use metrics::{counter, gauge, histogram};
    for destination in destinations {
        let destination = destination.as_ref().to_owned();
        for name in [
            ENQUEUED,
            DELIVERED,
            RETRIED,
            DEAD_LETTERED,
            DESTINATION_THROTTLED,
        ] {
            counter!(name, "destination" => destination.clone()).increment(0);
        }
        let _ = histogram!(DELIVERY_LATENCY, "destination" => destination.clone());
        for outcome in ATTEMPT_OUTCOMES {
            let _ = histogram!(
                ATTEMPT_DURATION,
                "destination" => destination.clone(),
                "outcome" => outcome,
            );
        }
    }
    counter!(LEASES_RECLAIMED).increment(0);
    gauge!(PENDING).increment(0.0);
    gauge!(OLDEST_PENDING_AGE).increment(0.0);
}

/// Makes the idempotency counters ([`IDEMPOTENCY_REPLAYS`], [`IDEMPOTENCY_MISMATCHES`],
/// [`IDEMPOTENCY_CONFLICTS`]) exist at 0 for the scopes a service declares, labelled as the
/// write path labels them ([`crate::idempotency::Scope::with_metric_label`], else the scope's name). Call it
/// once at start, after installing the recorder, with every scope the service uses.
pub fn register_scopes<'a>(scopes: impl IntoIterator<Item = &'a crate::idempotency::Scope>) {
    for scope in scopes {
        for name in [
            IDEMPOTENCY_REPLAYS,
            IDEMPOTENCY_MISMATCHES,
            IDEMPOTENCY_CONFLICTS,
        ] {
            metrics::counter!(name, "scope" => scope.metric_label_value()).increment(0);
        }
    }
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

    /// The two-hex-digit trace flags (`01`: sampled).
    pub fn flags(&self) -> &str {
        &self.0[53..55]
    }

    /// The context of a span that is a child of this one: the same trace id and flags, with
    /// `span_id` (non-zero) as the parent id, in version `00` (the only one this writes).
    pub fn child(&self, span_id: NonZeroU64) -> Self {
        Self(format!(
            "00-{}-{:016x}-{}",
            self.trace_id(),
            span_id.get(),
            self.flags()
        ))
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A random non-zero span id, for a child context when no tracer assigns one.
pub(crate) fn new_span_id() -> NonZeroU64 {
    loop {
        if let Some(id) = NonZeroU64::new(rand::random()) {
            return id;
        }
    }
}

impl fmt::Display for Traceparent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The trace id of a delivery's `traceparent` header, when it carries a valid one.
pub fn trace_id(headers: &BTreeMap<String, String>) -> Option<String> {
    traceparent(headers).map(|t| t.trace_id().to_owned())
}

/// A delivery's `traceparent` header (any case), when it carries a valid one.
pub fn traceparent(headers: &BTreeMap<String, String>) -> Option<Traceparent> {
    header(headers, TRACEPARENT).and_then(|value| Traceparent::parse(value.trim()).ok())
}

fn header<'a>(headers: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

/// The context one delivery attempt runs in and forwards: a child of the context stored at
/// enqueue (same trace, a new span id per attempt), so that each call a downstream receives is
/// its own span of the request's trace. With the `otel` feature and an OpenTelemetry layer
/// installed, `span` (the attempt's span) is made a child of the stored context and its own span
/// id is the one forwarded, so the exported span and the downstream's agree; with a layer and no
/// stored context, the attempt's span starts a trace of its own and that is forwarded.
/// `None` when there is nothing to forward.
pub(crate) fn attempt_context(
    span: &tracing::Span,
    headers: &BTreeMap<String, String>,
) -> Option<Traceparent> {
    let stored = traceparent(headers);
    #[cfg(feature = "otel")]
    if let Some(context) =
        otel::continue_trace(span, stored.as_ref(), header(headers, "tracestate"))
    {
        return Some(context);
    }
    #[cfg(not(feature = "otel"))]
    let _ = span;
    stored.map(|parent| parent.child(new_span_id()))
}

/// Replaces the `traceparent` header (whatever its case) with `context`.
pub(crate) fn set_traceparent(headers: &mut BTreeMap<String, String>, context: &Traceparent) {
    headers.retain(|key, _| !key.eq_ignore_ascii_case(TRACEPARENT));
    headers.insert(TRACEPARENT.to_owned(), context.as_str().to_owned());
}

/// The context of the current `tracing` span, as exported by the OpenTelemetry layer: what a
/// service passes to [`crate::idempotency::Claim::with_traceparent`] or [`crate::outbox::OutboxMessage::with_traceparent`]
/// so that the effects of a request join its trace. `None` when the current span has no valid
/// OpenTelemetry context (no layer installed, or the span is disabled).
#[cfg(feature = "otel")]
pub fn current_traceparent() -> Option<Traceparent> {
    otel::context_of(&tracing::Span::current())
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::Traceparent;

    /// Parents `span` on `stored` (when given) and returns the span's own context.
    pub(super) fn continue_trace(
        span: &tracing::Span,
        stored: Option<&Traceparent>,
        tracestate: Option<&str>,
    ) -> Option<Traceparent> {
        if let Some(parent) = stored.and_then(|p| remote_context(p, tracestate)) {
            // Fails only when no layer is installed or the span is disabled; the context read
            // below is then invalid and the caller falls back to a plain child id.
            let _ = span.set_parent(parent);
        }
        context_of(span)
    }

    pub(super) fn context_of(span: &tracing::Span) -> Option<Traceparent> {
        let context = span.context();
        let span_context = context.span().span_context().clone();
        if !span_context.is_valid() {
            return None;
        }
        Some(Traceparent(format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )))
    }

    fn remote_context(
        parent: &Traceparent,
        tracestate: Option<&str>,
    ) -> Option<opentelemetry::Context> {
        let trace_id = TraceId::from_hex(parent.trace_id()).ok()?;
        let span_id = SpanId::from_hex(parent.parent_id()).ok()?;
        let flags = u8::from_str_radix(parent.flags(), 16).ok()?;
        let state = tracestate
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let remote = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state);
        Some(opentelemetry::Context::new().with_remote_span_context(remote))
    }
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
    fn a_child_keeps_the_trace_and_flags_with_a_new_parent_id() {
        let parent = Traceparent::parse(VALID).expect("valid");
        let id = NonZeroU64::new(0xb7ad_6b71_6920_3331).expect("non-zero");
        let child = parent.child(id);
        assert_eq!(
            child.as_str(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
        );
        assert_eq!(Traceparent::parse(child.as_str()).ok(), Some(child.clone()));
        let future =
            Traceparent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future")
                .expect("valid");
        assert_eq!(
            future.child(NonZeroU64::MIN).as_str(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-00"
        );
        assert_ne!(new_span_id(), new_span_id());
    }

    #[test]
    fn set_traceparent_replaces_the_header_whatever_its_case() {
        let mut headers = BTreeMap::new();
        headers.insert("TraceParent".to_owned(), VALID.to_owned());
        headers.insert("tracestate".to_owned(), "a=1".to_owned());
        let child = Traceparent::parse(VALID)
            .expect("valid")
            .child(NonZeroU64::MIN);
        set_traceparent(&mut headers, &child);
        assert_eq!(headers.len(), 2);
        assert_eq!(traceparent(&headers), Some(child));
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
