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

#[cfg(feature = "logging")]
pub mod logs;
mod trace_context;

#[cfg(feature = "otel")]
pub use trace_context::current_traceparent;
pub(crate) use trace_context::{attempt_context, set_traceparent};
pub use trace_context::{trace_id, traceparent, Traceparent, TRACEPARENT};

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
