//! The relay's wake-up hint, sent after commit and coalesced.
//!
//! A `NOTIFY` inside the business transaction takes a database-wide lock at commit and serialises
//! every committing transaction. Instead, a service calls [`RelayWaker::wake`] after its commit;
//! one background task sends the hints, one at a time on a connection of its own: wakes that
//! arrive while a hint is out fold into the next one. A lost hint only delays delivery until the
//! relay's next poll.

use std::time::Duration;

use deadpool::managed::Manager as _;
use deadpool_postgres::ClientWrapper;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::Result;
use crate::store;
use crate::store::driver::WriteTx;

/// The channel the relays LISTEN on for the write path's hint.
pub const WAKE_CHANNEL: &str = wake_channel!();

/// Sends the relay's wake-up inside the caller's transaction. Postgres delivers it at commit, but
/// every NOTIFY takes a database-wide lock at commit, serialising all committing transactions:
/// prefer [`RelayWaker`] after commit, or leave waking to the relay's poll.
pub async fn notify_in_transaction(mut tx: impl WriteTx) -> Result<()> {
    tx.notify().await?;
    Ok(())
}

/// The shortest time between two hints: none beyond the hint's own round trip. One hint is out
/// at a time, and the wakes that arrive meanwhile fold into the next, so the hints never
/// outnumber the round trips of one connection; a relay with a backlog claims back to back and
/// needs no hint, an idle one is woken one round trip after a commit.
pub const HINT_SPACING: Duration = Duration::ZERO;

/// The first pause before the hint's connection is opened again after an attempt failed; it
/// doubles with each failure, up to [`RECONNECT_MAX`]. Hints go through the pool meanwhile.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The longest a hint, or the opening of its connection, may take: a server that stopped
/// answering costs the hints that long, then a new connection.
const HINT_TIMEOUT: Duration = Duration::from_secs(5);

/// A cheap, cloneable handle that asks the relays to look for new rows.
#[derive(Debug, Clone)]
pub struct RelayWaker {
    // Capacity 1: a wake while one is already queued is the same wake.
    queued: mpsc::Sender<()>,
}

impl RelayWaker {
    /// Starts the background task that sends the hints. It keeps one connection of its own,
    /// opened with `pool`'s settings but outside it: a hint never waits for, nor takes, one of
    /// the business connections. It opens the connection again when the server drops it; while
    /// it cannot, the hints borrow a connection from `pool`. The task ends when every handle is
    /// dropped.
    pub fn spawn(pool: deadpool_postgres::Pool) -> Self {
        let (queued, mut wakes) = mpsc::channel(1);
        tokio::spawn(async move {
            let mut line = HintLine::new(pool);
            while wakes.recv().await.is_some() {
                line.send().await;
            }
            line.close();
        });
        Self { queued }
    }

    /// Asks for a hint after a commit that enqueued rows. Never blocks.
    pub fn wake(&self) {
        // Full means a hint is already queued; closed means the runtime is going away.
        let _ = self.queued.try_send(());
    }
}

/// The waker's own connection to the server.
struct HintLine {
    pool: deadpool_postgres::Pool,
    client: Option<ClientWrapper>,
    /// No connection is opened before this (one failed to open); the pool serves meanwhile.
    retry_at: Instant,
    backoff: Duration,
}

impl HintLine {
    fn new(pool: deadpool_postgres::Pool) -> Self {
        Self {
            pool,
            client: None,
            retry_at: Instant::now(),
            backoff: RECONNECT_FIRST,
        }
    }

    /// Sends one hint: on the connection of its own (opened again at once when the server
    /// dropped it), else on one borrowed from the pool.
    async fn send(&mut self) {
        for _ in 0..2 {
            let Some(client) = self.connection().await else {
                break;
            };
            let error = match tokio::time::timeout(HINT_TIMEOUT, store::wake::hint(client)).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "timed out".to_owned(),
            };
            tracing::debug!(%error, "relay wake-up connection lost; opening another");
            self.close();
        }
        let sent = match self.pool.get().await {
            Ok(client) => store::wake::hint(&client).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "relay wake-up hint not sent");
        }
    }

    /// The connection, opened when there is none and no recent attempt failed.
    async fn connection(&mut self) -> Option<&tokio_postgres::Client> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.close();
        }
        if self.client.is_none() && Instant::now() >= self.retry_at {
            match self.open().await {
                Ok(client) => {
                    self.client = Some(client);
                    self.backoff = RECONNECT_FIRST;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "relay wake-up connection not opened; using the pool");
                    self.retry_at = Instant::now() + self.backoff;
                    self.backoff = (self.backoff * 2).min(RECONNECT_MAX);
                }
            }
        }
        self.client.as_deref()
    }

    async fn open(&self) -> std::result::Result<ClientWrapper, String> {
        match tokio::time::timeout(HINT_TIMEOUT, self.pool.manager().create()).await {
            Ok(opened) => opened.map_err(|e| e.to_string()),
            Err(_) => Err("timed out".to_owned()),
        }
    }

    /// Closes the connection (dropping it ends its task) and forgets its statement cache.
    fn close(&mut self) {
        if let Some(mut client) = self.client.take() {
            self.pool.manager().detach(&mut client);
        }
    }
}
