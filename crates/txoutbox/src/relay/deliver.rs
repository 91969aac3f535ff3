//! One attempt: hand a leased row to its sink, bounded by the lease, and classify what came back.
//! Nothing here writes an outcome; the completer does, in batches.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use super::flow::Signal;
use super::{storable, Finished, Held, Inner, Lease, Outcome, Stage};
use crate::error::Result;
use crate::sink::{Completion, DeliveryError, Receipt};
use crate::store::{self, Pooled};

/// Runs one attempt and classifies it. Never panics: a panicking sink is a retryable failure; a
/// sink call still running at the lease's call limit is cut off, its outcome unknown.
pub(super) async fn deliver(inner: &Inner, mut lease: Lease, held: &Held) -> Finished {
    let span = attempt_span(inner, &mut lease);
    let policy = inner.policy(&lease.delivery.destination);
    let (result, sink_started) = match call(inner, &lease, held, &span).await {
        Call::Made(result, started) => (result, started),
        Call::NotMade => return unstarted(lease),
    };
    let mut out = Finished {
        finished: lease.now(),
        lease,
        outcome: Outcome::Delivered,
        error: None,
        receipt: None,
        delay: Duration::ZERO,
        completion: None,
        signal: None,
    };
    let _enter = span.enter();
    if sink_started.is_some() {
        out.signal = signal(inner, policy, &out.lease.delivery.destination, &result);
    }
    let at_most_once = inner.at_most_once(&out.lease.delivery.destination);
    classify(&mut out, policy, at_most_once, result);
    if let Some(started) = sink_started {
        let outcome = match out.outcome {
            Outcome::Delivered => "delivered",
            Outcome::Retry => "retry",
            Outcome::Unknown => "unknown",
            _ => "failed",
        };
        metrics::histogram!(
            crate::telemetry::ATTEMPT_DURATION,
            "destination" => out.lease.delivery.destination.clone(),
            "outcome" => outcome,
        )
        .record(started.elapsed().as_secs_f64());
    }
    out
}

/// The attempt's span, a span of its own in the trace stored at enqueue; the sink forwards its
/// context (the stored row keeps the enqueue-time header).
fn attempt_span(inner: &Inner, lease: &mut Lease) -> tracing::Span {
    let span = tracing::info_span!(
        "delivery",
        relay = %inner.config.owner,
        message_id = %lease.delivery.id,
        destination = %lease.delivery.destination,
        attempt = lease.delivery.attempt,
        downstream_key = %lease.delivery.downstream_key,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        parent_span_id = tracing::field::Empty,
    );
    if let Some(parent) = crate::telemetry::traceparent(&lease.delivery.headers) {
        span.record("parent_span_id", parent.parent_id());
    }
    if let Some(context) = crate::telemetry::attempt_context(&span, &lease.delivery.headers) {
        span.record("trace_id", context.trace_id());
        span.record("span_id", context.parent_id());
        crate::telemetry::set_traceparent(&mut lease.delivery.headers, &context);
    }
    span
}

/// What the call step came to.
enum Call {
    /// The attempt's result, with the moment its sink was called (none when no sink was called:
    /// attempts spent, no sink registered).
    Made(
        std::result::Result<Receipt, DeliveryError>,
        Option<std::time::Instant>,
    ),
    /// No call: a row that waited for a slot for half its call limit, or an at-most-once row
    /// whose start could not be recorded under its lease.
    NotMade,
}

/// Calls the row's sink, bounded by the call limit, unless its attempts are spent or no sink is
/// registered for its destination (a permanent failure). An at-most-once row's start is
/// committed first.
async fn call(inner: &Inner, lease: &Lease, held: &Held, span: &tracing::Span) -> Call {
    let delivery = &lease.delivery;
    let policy = inner.policy(&delivery.destination);
    if delivery.attempt > policy.retry.max_attempts {
        let error = DeliveryError::permanent(format!(
            "{} attempts made (the last one's lease expired); the limit is {}",
            delivery.attempt - 1,
            policy.retry.max_attempts
        ));
        return Call::Made(Err(error), None);
    }
    let Some(sink) = inner.sinks.get(&delivery.destination) else {
        let error = DeliveryError::permanent(format!(
            "no sink is registered for destination {:?} on relay {}",
            delivery.destination, inner.config.owner
        ));
        return Call::Made(Err(error), None);
    };
    let Some(limit) = call_budget(inner.config.call_limit(), lease.claimed_at.elapsed()) else {
        tracing::info!(parent: span, "the row waited for a delivery slot too long; giving it back uncalled");
        return Call::NotMade;
    };
    if inner.at_most_once(&delivery.destination) {
        match mark_started(inner, lease).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(parent: span, "the lease was lost before the call; not calling");
                return Call::NotMade;
            }
            Err(e) => {
                tracing::warn!(parent: span, error = %e, "could not record the attempt's start; not calling");
                return Call::NotMade;
            }
        }
    }
    held.set(delivery.id, lease.token, Stage::Calling);
    let started = std::time::Instant::now();
    let call = AssertUnwindSafe(sink.deliver(delivery)).catch_unwind();
    let call = tracing::Instrument::instrument(call, span.clone());
    let result = match tokio::time::timeout(limit, call).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(DeliveryError::retryable(format!(
            "the sink panicked: {}",
            panic_text(&*panic)
        ))),
        Err(_) => Err(DeliveryError::indeterminate(format!(
            "the sink did not answer within {limit:?}, the relay's limit for one \
             call (the lease less the time to record the outcome)"
        ))),
    };
    Call::Made(result, Some(started))
}

/// How long a call may run for a row that waited `waited` since its claim (in the local queue,
/// or paced): the call limit less the wait, so that the call ends within the lease. `None` once
/// the row waited for half the limit: it goes back uncalled, claimable at once.
fn call_budget(limit: Duration, waited: Duration) -> Option<Duration> {
    (waited * 2 <= limit).then(|| limit - waited)
}

/// Turns the attempt's result into its outcome: delivered, a retry after the policy's delay,
/// dead-lettered (a permanent failure, or the last attempt), or unknown (an at-most-once call
/// whose outcome is not known).
fn classify(
    out: &mut Finished,
    policy: &super::DestinationPolicy,
    at_most_once: bool,
    result: std::result::Result<Receipt, DeliveryError>,
) {
    let attempt = out.lease.delivery.attempt;
    let last = attempt >= policy.retry.max_attempts;
    match result {
        Ok(Receipt(receipt)) => {
            tracing::debug!("delivered");
            let receipt = receipt.map(storable);
            out.completion = Some(Completion::Delivered(Receipt(receipt.clone())));
            out.receipt = receipt;
        }
        Err(DeliveryError::Indeterminate { message }) if at_most_once => {
            let message = storable(format!(
                "{message} (at-most-once destination: not retried; replay it if it did not happen)"
            ));
            tracing::warn!(error = %message, "outcome unknown");
            out.outcome = Outcome::Unknown;
            out.error = Some(message);
        }
        Err(DeliveryError::Retryable {
            message,
            retry_after,
        }) if !last => retry(out, policy, attempt, message, retry_after),
        Err(DeliveryError::Indeterminate { message }) if !last => {
            retry(out, policy, attempt, message, None)
        }
        Err(
            DeliveryError::Retryable { message, .. } | DeliveryError::Indeterminate { message },
        ) => {
            let message = storable(format!("gave up after {attempt} attempts: {message}"));
            tracing::warn!(error = %message, "dead-lettered");
            out.outcome = Outcome::Failed;
            out.completion = Some(Completion::DeadLettered(message.clone()));
            out.error = Some(message);
        }
        Err(DeliveryError::Permanent { message }) => {
            let message = storable(message);
            tracing::warn!(error = %message, "permanent failure; dead-lettered");
            out.outcome = Outcome::Failed;
            out.completion = Some(Completion::DeadLettered(message.clone()));
            out.error = Some(message);
        }
    }
}

/// What an attempt whose call started tells the destination's shared row: a call that reached
/// no verdict or failed retryably counts against the downstream for the breaker; a permanent
/// failure (a bad row) does not, but it ends a half-open breaker's probe without a verdict, so
/// the next probe need not wait for the lease of this one. A `Retry-After` delays its row
/// (`retry`); it counts for the throttle, which pauses the destination only when most recent
/// answers asked to wait.
fn signal(
    inner: &Inner,
    policy: &super::DestinationPolicy,
    destination: &str,
    result: &Result<Receipt, DeliveryError>,
) -> Option<Signal> {
    let throttled = match result {
        Err(DeliveryError::Retryable { retry_after, .. }) => *retry_after,
        _ => None,
    };
    let ceiling = policy
        .flow
        .max_in_flight
        .unwrap_or(inner.config.concurrency)
        .max(1);
    let throttle = inner.flow.answered(
        destination,
        throttled,
        result.is_ok(),
        policy.retry.cap,
        ceiling,
    );
    throttle.or(match result {
        Ok(_) => Some(Signal::Delivered),
        Err(DeliveryError::Retryable {
            retry_after: Some(_),
            ..
        }) => None,
        Err(DeliveryError::Retryable { .. } | DeliveryError::Indeterminate { .. }) => {
            Some(Signal::Failed)
        }
        Err(DeliveryError::Permanent { .. }) => Some(Signal::Inconclusive),
    })
}

/// A retryable failure: pending again after the policy's delay (a downstream's `Retry-After` is
/// honoured up to the policy's cap).
fn retry(
    out: &mut Finished,
    policy: &super::DestinationPolicy,
    attempt: u32,
    message: String,
    retry_after: Option<Duration>,
) {
    out.outcome = Outcome::Retry;
    out.delay = policy.retry.delay(attempt, retry_after);
    let message = storable(message);
    tracing::info!(error = %message, retry_in = ?out.delay, "delivery failed; will retry");
    out.error = Some(message);
}

/// A row handed back without a call: its lease was lost, or its start could not be recorded. No
/// verdict on the downstream ([`Signal::Inconclusive`]: a probe handed back so is freed).
fn unstarted(lease: Lease) -> Finished {
    Finished {
        finished: lease.now(),
        lease,
        outcome: Outcome::Unstarted,
        error: None,
        receipt: None,
        delay: Duration::ZERO,
        completion: None,
        signal: Some(Signal::Inconclusive),
    }
}

/// Commits an at-most-once attempt's start; false when the lease is no longer ours.
async fn mark_started(inner: &Inner, lease: &Lease) -> Result<bool> {
    let client = inner.pool.get().await?;
    let conn = Pooled::new(&client, inner.config.prepared_statements);
    Ok(store::messages::mark_started(&conn, lease.delivery.id, lease.token).await?)
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_ends_within_the_lease_whatever_the_row_waited() {
        let limit = Duration::from_secs(28);
        assert_eq!(call_budget(limit, Duration::ZERO), Some(limit));
        assert_eq!(
            call_budget(limit, Duration::from_secs(10)),
            Some(Duration::from_secs(18))
        );
        assert_eq!(call_budget(limit, Duration::from_secs(15)), None);
    }
}
