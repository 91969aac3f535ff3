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
    // The attempt is a span of its own in the trace stored at enqueue, and the sink forwards its
    // context (the stored row keeps the enqueue-time header).
    if let Some(parent) = crate::telemetry::traceparent(&lease.delivery.headers) {
        span.record("parent_span_id", parent.parent_id());
    }
    if let Some(context) = crate::telemetry::attempt_context(&span, &lease.delivery.headers) {
        span.record("trace_id", context.trace_id());
        span.record("span_id", context.parent_id());
        crate::telemetry::set_traceparent(&mut lease.delivery.headers, &context);
    }
    let delivery = &lease.delivery;
    let policy = inner.policy(&delivery.destination);
    let at_most_once = inner.at_most_once(&delivery.destination);
    let mut sink_started = None;
    let result = if delivery.attempt > policy.retry.max_attempts {
        Err(DeliveryError::permanent(format!(
            "{} attempts made (the last one's lease expired); the limit is {}",
            delivery.attempt - 1,
            policy.retry.max_attempts
        )))
    } else {
        match inner.sinks.get(&delivery.destination) {
            None => Err(DeliveryError::permanent(format!(
                "no sink is registered for destination {:?} on relay {}",
                delivery.destination, inner.config.owner
            ))),
            Some(sink) => {
                if at_most_once {
                    match mark_started(inner, &lease).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::info!(parent: &span, "the lease was lost before the call; not calling");
                            return unstarted(lease);
                        }
                        Err(e) => {
                            tracing::warn!(parent: &span, error = %e, "could not record the attempt's start; not calling");
                            return unstarted(lease);
                        }
                    }
                }
                held.set(delivery.id, lease.token, Stage::Calling);
                sink_started = Some(std::time::Instant::now());
                let limit = inner.config.call_limit();
                let call = AssertUnwindSafe(sink.deliver(delivery)).catch_unwind();
                let call = tracing::Instrument::instrument(call, span.clone());
                match tokio::time::timeout(limit, call).await {
                    Ok(Ok(result)) => result,
                    Ok(Err(panic)) => Err(DeliveryError::retryable(format!(
                        "the sink panicked: {}",
                        panic_text(&*panic)
                    ))),
                    Err(_) => Err(DeliveryError::indeterminate(format!(
                        "the sink did not answer within {limit:?}, the relay's limit for one \
                         call (the lease less the time to record the outcome)"
                    ))),
                }
            }
        }
    };
    let finished = lease.now();
    let mut out = Finished {
        lease: lease.clone(),
        outcome: Outcome::Delivered,
        error: None,
        receipt: None,
        delay: Duration::ZERO,
        finished,
        completion: None,
        signal: None,
    };
    let _enter = span.enter();
    let attempt = lease.delivery.attempt;
    let last = attempt >= policy.retry.max_attempts;
    if sink_started.is_some() {
        out.signal = signal(inner, policy, &delivery.destination, &result);
    }
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
        }) if !last => retry(&mut out, policy, attempt, message, retry_after),
        Err(DeliveryError::Indeterminate { message }) if !last => {
            retry(&mut out, policy, attempt, message, None)
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
    if let Some(started) = sink_started {
        let outcome = match out.outcome {
            Outcome::Delivered => "delivered",
            Outcome::Retry => "retry",
            Outcome::Unknown => "unknown",
            _ => "failed",
        };
        metrics::histogram!(
            crate::telemetry::ATTEMPT_DURATION,
            "destination" => lease.delivery.destination.clone(),
            "outcome" => outcome,
        )
        .record(started.elapsed().as_secs_f64());
    }
    out
}

/// What an attempt whose call started tells the destination's shared row: a call that reached
/// no verdict or failed retryably counts against the downstream for the breaker; a permanent
/// failure (a bad row) does not. A `Retry-After` delays its row (`retry`); it counts for the
/// throttle, which pauses the destination only when most recent answers asked to wait.
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
        Err(DeliveryError::Permanent { .. }) => None,
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

/// A row handed back without a call: its lease was lost, or its start could not be recorded.
fn unstarted(lease: Lease) -> Finished {
    Finished {
        finished: lease.now(),
        lease,
        outcome: Outcome::Unstarted,
        error: None,
        receipt: None,
        delay: Duration::ZERO,
        completion: None,
        signal: None,
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
