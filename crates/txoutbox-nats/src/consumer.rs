//! The receiving half for JetStream: [`JetStreamConsumer`] pulls from a durable consumer and
//! applies each message once, in a Postgres transaction with its inbox record
//! ([`txoutbox::inbox`]), keyed by `Nats-Msg-Id` (the stream and sequence when absent). The ack
//! is sent only after the commit; a retryable failure is nakked with a delay, a permanent one
//! recorded and terminated. Unacked messages (a crash, a stop past the grace period) are
//! redelivered by the server after its ack wait, and the inbox makes them duplicates.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use txoutbox::inbox::{self, Consumer, InboxClaim, Receive};

use crate::sink::{NatsError, NATS_MSG_ID};

/// What a handler's failure asks the consumer to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// Try again later (the database is down, a dependency timed out): the transaction is
    /// rolled back and the message nakked with the consumer's delay.
    #[error("retryable: {0}")]
    Retryable(String),
    /// This message can never be applied (a payload the handler cannot read): the transaction
    /// is rolled back, the failure recorded in the inbox ([`inbox::record_failure`]) and the
    /// message terminated (never redelivered).
    #[error("permanent: {0}")]
    Permanent(String),
}

impl From<txoutbox::Error> for HandlerError {
    /// Caller input the library refuses (an invalid payload or effect) is permanent; the rest
    /// (an unreachable store, a conflict, a database error) is retryable.
    fn from(e: txoutbox::Error) -> Self {
        match e {
            txoutbox::Error::Invalid(_) | txoutbox::Error::Payload(_) | txoutbox::Error::Key(_) => {
                HandlerError::Permanent(e.to_string())
            }
            other => HandlerError::Retryable(other.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for HandlerError {
    fn from(e: tokio_postgres::Error) -> Self {
        txoutbox::Error::from(e).into()
    }
}

/// Applies one message inside the consumer's transaction.
///
/// Write the message's effects with `tx` (the business rows) and `claim` (its onward outbox
/// effects, whose downstream keys derive from the consumer, the message id and the effect);
/// the consumer completes the claim, commits and acks. Return an error to roll everything back.
///
/// A seam: implement it for each kind of message a service consumes.
#[async_trait::async_trait]
pub trait MessageHandler: Send + Sync + 'static {
    /// Applies `message` (its id is `claim.message_id()`).
    async fn handle(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        message: &jetstream::Message,
        claim: &mut InboxClaim,
    ) -> Result<(), HandlerError>;
}

/// A shared handler (one the caller also keeps, to look at or to reuse).
#[async_trait::async_trait]
impl<H: MessageHandler> MessageHandler for std::sync::Arc<H> {
    async fn handle(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        message: &jetstream::Message,
        claim: &mut InboxClaim,
    ) -> Result<(), HandlerError> {
        (**self).handle(tx, message, claim).await
    }
}

/// What a run did, counted when each message's ack (or nak, or term) was sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerReport {
    /// Messages applied and acked.
    pub processed: u64,
    /// Redeliveries found in the inbox and acked without running the handler.
    pub duplicates: u64,
    /// Failures nakked for a later retry.
    pub retried: u64,
    /// Messages given up (recorded and terminated).
    pub failed: u64,
}

#[derive(Default)]
struct Counters {
    processed: AtomicU64,
    duplicates: AtomicU64,
    retried: AtomicU64,
    failed: AtomicU64,
}

impl Counters {
    fn report(&self) -> ConsumerReport {
        ConsumerReport {
            processed: self.processed.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// The default number of messages handled at once.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// The default delay before a nakked message is redelivered.
pub const DEFAULT_NAK_DELAY: Duration = Duration::from_secs(1);
/// The default time in-flight messages get to finish after the shutdown.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// A runner that applies the messages of a durable JetStream pull consumer once each.
///
/// ```no_run
/// use txoutbox::inbox::{Consumer, InboxClaim};
/// use txoutbox_nats::{HandlerError, JetStreamConsumer, MessageHandler};
///
/// struct Ship;
///
/// #[async_trait::async_trait]
/// impl MessageHandler for Ship {
///     async fn handle(&self, tx: &deadpool_postgres::Transaction<'_>,
///         message: &async_nats::jetstream::Message, _claim: &mut InboxClaim)
///         -> Result<(), HandlerError> {
///         tx.execute("INSERT INTO shipments (event) VALUES ($1)", &[&message.payload.as_ref()]).await?;
///         Ok(())
///     }
/// }
///
/// # async fn run(js: async_nats::jetstream::Context, pool: deadpool_postgres::Pool)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// let shutdown = txoutbox::relay::Shutdown::on_signal()?;
/// JetStreamConsumer::new(js, "ORDERS", "shipping", pool, Consumer::new("shipping")?, Ship)
///     .with_concurrency(32)
///     .run(shutdown.wait())
///     .await?;
/// # Ok(()) }
/// ```
pub struct JetStreamConsumer<H> {
    jetstream: jetstream::Context,
    stream: String,
    durable: String,
    pool: deadpool_postgres::Pool,
    consumer: Consumer,
    handler: H,
    concurrency: usize,
    nak_delay: Duration,
    grace: Duration,
    counters: Counters,
}

impl<H: MessageHandler> JetStreamConsumer<H> {
    /// A runner for the durable pull consumer `durable` of stream `stream` (created beforehand,
    /// with explicit acks), applying each message with `handler` in a transaction on `pool`,
    /// recorded in the inbox of `consumer`.
    pub fn new(
        jetstream: jetstream::Context,
        stream: &str,
        durable: &str,
        pool: deadpool_postgres::Pool,
        consumer: Consumer,
        handler: H,
    ) -> Self {
        Self {
            jetstream,
            stream: stream.to_owned(),
            durable: durable.to_owned(),
            pool,
            consumer,
            handler,
            concurrency: DEFAULT_CONCURRENCY,
            nak_delay: DEFAULT_NAK_DELAY,
            grace: DEFAULT_GRACE,
            counters: Counters::default(),
        }
    }

    /// How many messages are handled at once (16 by default; at least 1). Keep the pool at
    /// least this large.
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// How long the server waits before redelivering a message whose handler failed
    /// retryably (1 s by default).
    pub fn with_nak_delay(mut self, delay: Duration) -> Self {
        self.nak_delay = delay;
        self
    }

    /// How long in-flight messages get to finish once the shutdown resolves (10 s by default);
    /// those still running then are abandoned unacked (rolled back), and the server redelivers
    /// them after its ack wait.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Pulls and applies messages until `shutdown` resolves, then stops pulling, lets the
    /// in-flight messages finish (up to the grace period) and returns what it did. Fails when
    /// the durable consumer cannot be found or its message stream cannot be opened.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ConsumerReport, NatsError> {
        let pull: PullConsumer = self
            .jetstream
            .get_consumer_from_stream(&self.durable, &self.stream)
            .await
            .map_err(|e| self.error(e))?;
        let messages = pull.messages().await.map_err(|e| self.error(e))?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let work = messages
            .take_until(wait_for(stopped.clone()))
            .for_each_concurrent(self.concurrency, |message| async {
                match message {
                    Ok(message) => self.process(message).await,
                    Err(e) => tracing::warn!(error = %e, "JetStream pull failed; pulling on"),
                }
            });
        let mut work = std::pin::pin!(work);
        tokio::select! {
            () = &mut work => {}
            () = shutdown => {
                let _ = stop.send(true);
                if tokio::time::timeout(self.grace, work).await.is_err() {
                    tracing::warn!("grace period over: unfinished messages will be redelivered");
                }
            }
        }
        Ok(self.counters.report())
    }

    fn error(&self, e: impl std::fmt::Display) -> NatsError {
        NatsError::Stream {
            name: self.stream.clone(),
            message: format!("consumer {}: {e}", self.durable),
        }
    }

    /// Applies one message and answers the server: ack, nak with delay, or term.
    async fn process(&self, message: jetstream::Message) {
        let id = message_id(&message);
        let answer = match self.apply(&message, &id).await {
            Ok(Applied::New) => (AckKind::Ack, &self.counters.processed),
            Ok(Applied::Duplicate) => (AckKind::Ack, &self.counters.duplicates),
            Err(HandlerError::Retryable(e)) => {
                tracing::warn!(message_id = %id, error = %e, "handler failed; nakked for a retry");
                (AckKind::Nak(Some(self.nak_delay)), &self.counters.retried)
            }
            Err(HandlerError::Permanent(e)) => self.give_up(&id, &e).await,
        };
        let (kind, counter) = answer;
        // Acked with the server's confirmation: an ack lost on the way is redelivered, and the
        // redelivery is a duplicate.
        match message.double_ack_with(kind).await {
            Ok(()) => {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(message_id = %id, error = %e, "answer to JetStream lost"),
        }
    }

    /// Records a permanent failure and terminates the message; if the record cannot be
    /// written, the message is nakked instead (nothing is lost).
    async fn give_up<'c>(&'c self, id: &str, error: &str) -> (AckKind, &'c AtomicU64) {
        tracing::error!(message_id = %id, error = %error, "handler failed for good; terminated");
        let recorded = async {
            let mut conn = self.pool.get().await.map_err(txoutbox::Error::from)?;
            let tx = conn.transaction().await?;
            inbox::record_failure(&tx, &self.consumer, id, error).await?;
            tx.commit().await?;
            Ok::<_, txoutbox::Error>(())
        }
        .await;
        match recorded {
            Ok(()) => (AckKind::Term, &self.counters.failed),
            Err(e) => {
                tracing::warn!(message_id = %id, error = %e, "failure not recorded; nakked");
                (AckKind::Nak(Some(self.nak_delay)), &self.counters.retried)
            }
        }
    }

    async fn apply(&self, message: &jetstream::Message, id: &str) -> Result<Applied, HandlerError> {
        let mut conn = self.pool.get().await.map_err(txoutbox::Error::from)?;
        let tx = conn.transaction().await?;
        let mut claim = match inbox::receive(&tx, &self.consumer, id).await? {
            Receive::New(claim) => claim,
            Receive::Duplicate { .. } => return Ok(Applied::Duplicate),
        };
        self.handler.handle(&tx, message, &mut claim).await?;
        claim.complete(&tx).await?;
        tx.commit().await?;
        Ok(Applied::New)
    }
}

enum Applied {
    New,
    Duplicate,
}

/// Resolves once `stopped` says true.
async fn wait_for(mut stopped: tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// The inbox key of a message: its `Nats-Msg-Id` when it carries a usable one (1..=255 bytes,
/// no control characters), else `{stream}:{stream sequence}`, the same on every redelivery.
pub fn message_id(message: &jetstream::Message) -> String {
    let header = message
        .headers
        .as_ref()
        .and_then(|h| h.get(NATS_MSG_ID))
        .map(|v| v.as_str().to_owned())
        .filter(|id| !id.is_empty() && id.len() <= 255 && !id.chars().any(char::is_control));
    if let Some(id) = header {
        return id;
    }
    match message.info() {
        Ok(info) => format!("{}:{}", info.stream, info.stream_sequence),
        // A message without a reply subject is no JetStream delivery; its subject is all
        // there is.
        Err(_) => message.subject.to_string(),
    }
}
