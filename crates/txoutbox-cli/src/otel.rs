//! OpenTelemetry export of the relay's delivery spans (the `otel` feature), configured by the
//! standard `OTEL_*` environment variables. Off unless an OTLP endpoint is set.

use anyhow::{Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The variables that turn export on: a base URL (`/v1/traces` is appended) or the full traces
/// URL. The exporter reads them, with `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT` and the
/// `OTEL_BSP_*` batch settings, itself.
const ENDPOINTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// The service name reported when `OTEL_SERVICE_NAME` (or `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`) does not set one.
const DEFAULT_SERVICE_NAME: &str = "txoutbox-relay";

/// The export layer, boxed: its type depends on the subscriber it is stacked on.
pub type BoxedLayer<S> = Box<dyn Layer<S> + Send + Sync>;

/// Exports spans until dropped; dropping flushes what is buffered (bounded by the exporter's
/// timeout), so call it after the runtime has finished.
pub struct Export {
    provider: SdkTracerProvider,
}

impl Drop for Export {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("warning: OpenTelemetry export did not flush: {e}");
        }
    }
}

/// The layer exporting txoutbox's spans (at `info` and above, whatever `RUST_LOG` says: it filters
/// the log output only) over OTLP/HTTP, when an endpoint is configured and `OTEL_SDK_DISABLED` is
/// not `true`; `None` otherwise. Must be called outside the async runtime (the exporter's HTTP
/// client runs on the batch processor's own thread).
pub fn layer<S>() -> Result<Option<(BoxedLayer<S>, Export)>>
where
    S: Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
{
    let configured = ENDPOINTS
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    if !configured || disabled {
        return Ok(None);
    }
    // The exporter's HTTP client (for an https endpoint) needs a TLS provider; the sinks install
    // the same one when they build theirs.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .context("cannot build the OTLP span exporter (check OTEL_EXPORTER_OTLP_*)")?;
    let mut resource = Resource::builder();
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    if !named {
        resource = resource.with_service_name(DEFAULT_SERVICE_NAME);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("txoutbox");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(
            Targets::new()
                .with_target("txoutbox", tracing::Level::INFO)
                .with_target("txoutbox_webhook", tracing::Level::INFO)
                .with_target("txoutbox_stripe", tracing::Level::INFO)
                .with_target("txoutbox_email", tracing::Level::INFO)
                .with_target("txoutbox_nats", tracing::Level::INFO),
        )
        .boxed();
    Ok(Some((layer, Export { provider })))
}
