//! The relay's ear: a dedicated connection that LISTENs for the write path's hint and wakes the
//! claimer. It reconnects by itself; while it is down the relay only polls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;

use crate::pg::PgConfig;
use crate::store;

/// Listens until `stop` is notified; `connected` says whether the LISTEN is live.
pub(crate) async fn listen(
    config: PgConfig,
    wake: Arc<Notify>,
    connected: Arc<AtomicBool>,
    stop: Arc<Notify>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let session = run_once(&config, &wake, &connected);
        tokio::select! {
            _ = stop.notified() => break,
            result = session => {
                connected.store(false, Ordering::Relaxed);
                if let Err(e) = result {
                    tracing::warn!(error = %crate::pg::describe(&e), "relay listener disconnected; polling until it is back");
                }
            }
        }
        // A hint may have been lost while the listener was down: look once.
        wake.notify_one();
        tokio::select! {
            _ = stop.notified() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    connected.store(false, Ordering::Relaxed);
}

async fn run_once(
    config: &PgConfig,
    wake: &Notify,
    connected: &AtomicBool,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.config().connect(config.tls()).await?;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen = store::wake::listen(&client);
    tokio::pin!(listen);
    // Drive the connection while the LISTEN is answered.
    loop {
        tokio::select! {
            result = &mut listen => { result?; break; }
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
                Some(Ok(AsyncMessage::Notice(notice))) => crate::pg::log_notice(&notice),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    }
    connected.store(true, Ordering::Relaxed);
    tracing::debug!("relay listener connected");
    while let Some(message) = messages.next().await {
        match message? {
            AsyncMessage::Notification(_) => wake.notify_one(),
            AsyncMessage::Notice(notice) => crate::pg::log_notice(&notice),
            _ => {}
        }
    }
    Ok(())
}
