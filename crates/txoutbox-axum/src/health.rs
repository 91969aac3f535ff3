//! Health of a process that runs a relay: `/healthz` (the process answers), `/readyz` (its
//! database answers through the relay's pool, with the schema this build needs, and its LISTEN
//! connection is up), as routes to mount
//! in a service's router, and, with the `prometheus` feature, [`MetricsServer`], the three
//! endpoints with `/metrics` on an address of their own (what `txoutbox relay --metrics-addr`
//! serves).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use txoutbox::relay::Relay;

/// How long `/readyz` waits for the database's answer.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// What `/readyz` checks.
#[derive(Clone)]
struct Readiness {
    relay: Relay,
    poll_only: bool,
}

/// `GET /healthz` (200 `ok` while the process runs) and `GET /readyz` (200 `ready` when the
/// database answers through `relay`'s pool within [`READY_TIMEOUT`], its schema is the version
/// this build needs ([`txoutbox::check_schema`], one small query a probe) and, unless
/// `poll_only`, the relay's LISTEN connection is up; 503 `not ready: <reason>` otherwise, the
/// reason of a schema that does not match being the line that says what to run). Merge them
/// into a service's router: `router.merge(txoutbox_axum::health::routes(&relay, false))`.
pub fn routes<S>(relay: &Relay, poll_only: bool) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readiness))
        .with_state(Readiness {
            relay: relay.clone(),
            poll_only,
        })
}

async fn readiness(State(state): State<Readiness>) -> (StatusCode, String) {
    let pool = state.relay.pool().clone();
    let probe = tokio::time::timeout(READY_TIMEOUT, async move {
        let client = pool.get().await?;
        txoutbox::check_schema(&client).await
    })
    .await;
    let not_ready = |reason: String| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
    };
    match probe {
        Err(_) => {
            return not_ready(format!(
                "the database did not answer within {}",
                humantime::format_duration(READY_TIMEOUT)
            ))
        }
        Ok(Err(txoutbox::Error::StoreUnavailable { message: e, .. })) => {
            return not_ready(format!("the database is unreachable: {e}"))
        }
        // The schema's own line (what to run), or the database's answer.
        Ok(Err(e)) => return not_ready(e.to_string()),
        Ok(Ok(_)) => {}
    }
    if !state.poll_only && !state.relay.listener_connected() {
        return not_ready("the LISTEN connection is down".to_owned());
    }
    (StatusCode::OK, "ready\n".to_owned())
}

#[cfg(feature = "prometheus")]
pub use server::MetricsServer;

#[cfg(feature = "prometheus")]
mod server {
    use std::future::Future;
    use std::net::SocketAddr;

    use metrics_exporter_prometheus::PrometheusHandle;
    use txoutbox::relay::Relay;

    /// A relay process's observability endpoints on an address of their own: `/metrics`
    /// (Prometheus text), `/healthz` and `/readyz` (see [`routes`](super::routes)). Built with
    /// [`bind`](Self::bind), served by [`run`](Self::run) until its shutdown resolves.
    pub struct MetricsServer {
        listener: tokio::net::TcpListener,
        router: axum::Router,
    }

    impl MetricsServer {
        /// Binds `addr` (so a taken port fails before the relay starts).
        pub async fn bind(
            addr: SocketAddr,
            prometheus: PrometheusHandle,
            relay: &Relay,
            poll_only: bool,
        ) -> std::io::Result<Self> {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(addr = %listener.local_addr()?, "metrics server listening");
            let router = axum::Router::new()
                .route("/metrics", crate::prometheus::route(prometheus))
                .merge(super::routes(relay, poll_only));
            Ok(Self { listener, router })
        }

        /// The address it listens on.
        pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
            self.listener.local_addr()
        }

        /// Serves until `shutdown` resolves, then finishes the requests in progress and returns.
        pub async fn run(
            self,
            shutdown: impl Future<Output = ()> + Send + 'static,
        ) -> std::io::Result<()> {
            axum::serve(self.listener, self.router)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}
