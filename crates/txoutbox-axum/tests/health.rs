//! `txoutbox_axum::health::routes` merged into a service's own router, over real HTTP: the
//! endpoints an embedding service gets without the CLI's metrics server.

use axum::routing::get;
use axum::Router;
use txoutbox::relay::Shutdown;
use txoutbox_test_support::relay::{RecordingSink, RunningRelay};
use txoutbox_test_support::{eventually_some, test_db};

async fn serve(router: Router) -> anyhow::Result<(String, Shutdown)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let shutdown = Shutdown::new();
    let stop = shutdown.wait();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(stop)
            .await
    });
    Ok((base, shutdown))
}

async fn get_text(url: &str) -> anyhow::Result<(u16, String)> {
    txoutbox::sink::ensure_crypto_provider();
    let response = reqwest::get(url).await?;
    Ok((response.status().as_u16(), response.text().await?))
}

#[tokio::test]
async fn an_embedding_service_serves_the_relays_health_beside_its_own_routes() -> anyhow::Result<()>
{
    let db = test_db().await?;
    let relay = db.relay()?.sink("email", RecordingSink::new()).build()?;
    let router = Router::new()
        .route("/charge", get(|| async { "the service's own route\n" }))
        .merge(txoutbox_axum::health::routes(&relay, false));
    let (base, shutdown) = serve(router).await?;

    assert_eq!(
        get_text(&format!("{base}/healthz")).await?,
        (200, "ok\n".into())
    );
    assert_eq!(
        get_text(&format!("{base}/charge")).await?,
        (200, "the service's own route\n".into())
    );
    // The relay is built but not running: its LISTEN connection is not up yet.
    let (status, body) = get_text(&format!("{base}/readyz")).await?;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("LISTEN connection is down"), "{body}");

    let running = RunningRelay::start(relay);
    let ready = eventually_some("/readyz answering 200", || async {
        let ready = get_text(&format!("{base}/readyz")).await?;
        Ok((ready.0 == 200).then_some(ready))
    })
    .await?;
    assert_eq!(ready, (200, "ready\n".into()));
    running.stop().await?;
    shutdown.trigger();
    Ok(())
}

#[tokio::test]
async fn a_poll_only_service_is_ready_when_its_database_answers() -> anyhow::Result<()> {
    let db = test_db().await?;
    let relay = db.relay()?.sink("email", RecordingSink::new()).build()?;
    let (base, shutdown) = serve(txoutbox_axum::health::routes(&relay, true)).await?;
    assert_eq!(
        get_text(&format!("{base}/readyz")).await?,
        (200, "ready\n".into())
    );
    shutdown.trigger();
    Ok(())
}
