//! Trace context: the W3C `traceparent` an outbox row carries, its parsing and the child context
//! of each delivery attempt, and (feature `otel`) the OpenTelemetry span of that context.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU64;

use crate::error::{Error, Result};

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
