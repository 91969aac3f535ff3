//! Prometheus for a service (the `prometheus` feature): a recorder with buckets sized for
//! txoutbox's histograms, and the `GET /metrics` route that renders it. The `txoutbox relay`
//! command serves the same through its `--metrics-addr`.

use axum::http::header;
use axum::routing::{get, MethodRouter};
use metrics_exporter_prometheus::Matcher;
pub use metrics_exporter_prometheus::{
    BuildError, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use txoutbox::telemetry::{ATTEMPT_DURATION, DELIVERY_LATENCY};

/// The Prometheus text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets of `txoutbox_attempt_duration_seconds`: one sink call, 1 ms to 30 s.
const ATTEMPT_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of `txoutbox_delivery_latency_seconds`: commit to delivery, 5 ms to a day (retries
/// and outages included).
const LATENCY_BUCKETS: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0, 21600.0, 86400.0,
];

/// A Prometheus builder whose txoutbox histograms are rendered as histograms with the buckets
/// above (the exporter renders unconfigured histograms as summaries, which cannot be aggregated
/// across processes). Add your own settings, then install or build it.
pub fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(ATTEMPT_DURATION.to_owned()), &ATTEMPT_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(DELIVERY_LATENCY.to_owned()), &LATENCY_BUCKETS)
}

/// Installs [`builder`]'s recorder as the process's `metrics` recorder and registers the
/// descriptions of txoutbox's metrics. Once per process: a second call fails.
pub fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    txoutbox::telemetry::describe_metrics();
    Ok(handle)
}

/// `GET`: the recorder's metrics as Prometheus text. Mount it with
/// `router.route("/metrics", txoutbox_axum::prometheus::route(handle))`.
pub fn route<S>(handle: PrometheusHandle) -> MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    get(move || async move {
        // Upkeep drains the histograms' pending samples; a scrape is when they are needed.
        handle.run_upkeep();
        ([(header::CONTENT_TYPE, CONTENT_TYPE)], handle.render())
    })
}
