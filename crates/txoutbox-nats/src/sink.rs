//! The JetStream sink: publish with `Nats-Msg-Id`, wait for the ack, classify failures.

use std::fmt;
use std::time::Duration;

use async_nats::jetstream::context::{GetStreamByNameErrorKind, PublishError, PublishErrorKind};
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use txoutbox::sink::{Delivery, DeliveryError, Receipt, Sink};

use crate::message::{check_subject, NatsMessage};

/// JetStream's deduplication header.
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// How long one publish may take by default, its ack included (async-nats's own ack timeout).
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Rejections that a retry with the same message cannot change: the message or its headers are
/// too large for the stream, an expectation header does not hold, the stream is sealed, or a
/// per-message TTL is invalid or disabled.
const PERMANENT_CODES: [ErrorCode; 9] = [
    ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM,
    ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM,
    ErrorCode::STREAM_NOT_MATCH,
    ErrorCode::STREAM_WRONG_LAST_MESSAGE_ID,
    ErrorCode::STREAM_WRONG_LAST_SEQUENCE,
    ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT,
    ErrorCode::STREAM_SEALED,
    ErrorCode::MESSAGE_TTL_INVALID,
    ErrorCode::MESSAGE_TTL_DISABLED,
];

/// Why a sink could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// The server could not be reached (or refused the connection).
    #[error("connecting to NATS at {url}: {source}")]
    Connect {
        /// The URL given.
        url: String,
        /// What the client said.
        source: async_nats::ConnectError,
    },
    /// A JetStream stream could not be created or looked up.
    #[error("JetStream stream {name}: {message}")]
    Stream {
        /// The stream's name.
        name: String,
        /// What JetStream said.
        message: String,
    },
}

/// What JetStream acknowledged, as stored in the delivered row's receipt (compact JSON:
/// `{"stream":"ORDERS","seq":7,"duplicate":false}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishReceipt {
    /// The stream that stored the message.
    pub stream: String,
    /// Its sequence in the stream (for a duplicate: the sequence of the message first stored).
    pub seq: u64,
    /// True when JetStream recognised the `Nats-Msg-Id` within its duplicate window and did not
    /// store the message again: a redelivery of an effect that had already happened.
    pub duplicate: bool,
}

impl PublishReceipt {
    /// Reads a receipt back from its stored text.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

impl fmt::Display for PublishReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_string(self) {
            Ok(text) => f.write_str(&text),
            Err(_) => Err(fmt::Error),
        }
    }
}

/// Publishes [`NatsMessage`] rows to JetStream with `Nats-Msg-Id` = the row's downstream key and
/// waits for the ack, so a redelivery within the stream's duplicate window is dropped by
/// JetStream (the ack then says `duplicate`) and the stream holds the message once.
///
/// The duplicate window must outlast the longest a redelivery can take: the relay's lease
/// (30 s by default) plus the retry delays up to the attempt that repeats it. JetStream's default
/// window is 2 minutes; [`NatsSink::ensure_stream`] takes it as an argument.
///
/// Outcomes: the ack delivers, with a [`PublishReceipt`]; an ack timeout, a broken connection,
/// too many pending acks, or any rejection not known to be final retry. No responders means no
/// stream is listening on the subject at that moment: the sink asks JetStream whether a stream
/// captures the subject at all, and when JetStream answers that none does the row is
/// dead-lettered (permanent: a configuration error; create the stream, then replay the row),
/// otherwise (a stream without a leader, JetStream unreachable) it retries. Also permanent: a
/// row with no subject or an invalid one, a message larger than the server or stream accepts,
/// and the rejections in JetStream's final set (sealed stream, failed expectations).
#[derive(Clone)]
pub struct NatsSink {
    jetstream: jetstream::Context,
    subject: Option<String>,
    /// The bound of one call, and the JetStream context's ack timeout.
    timeout: Duration,
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl NatsSink {
    /// Connects to the NATS server at `url` (`nats://127.0.0.1:4222`, or several separated by
    /// commas). Fails when no server answers; for credentials, TLS or reconnect settings connect
    /// with `async_nats::ConnectOptions` yourself and use [`NatsSink::new`].
    pub async fn connect(url: &str) -> Result<Self, NatsError> {
        let client = async_nats::ConnectOptions::new()
            .name("txoutbox-relay")
            .connect(url)
            .await
            .map_err(|source| NatsError::Connect {
                url: url.to_owned(),
                source,
            })?;
        Ok(Self::new(client))
    }

    /// A sink over an existing client (cheap to clone: one connection can serve many sinks).
    pub fn new(client: async_nats::Client) -> Self {
        let mut jetstream = jetstream::new(client);
        jetstream.set_timeout(DEFAULT_ACK_TIMEOUT);
        Self {
            jetstream,
            subject: None,
            timeout: DEFAULT_ACK_TIMEOUT,
        }
    }

    /// The subject of rows whose payload names none (one sink per destination, each with its
    /// subject: `"nats:orders"` → `orders.events`).
    pub fn with_subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// How long one publish may take (default [`DEFAULT_ACK_TIMEOUT`], 5 s): the wait for
    /// JetStream's ack, and the whole call with it (a publish queued behind a reconnect or a full
    /// send buffer, the stream lookup after no responders). A call cut off is retried. The sink
    /// reports it as its [`Sink::timeout`]: the relay refuses to start with a lease that cannot
    /// hold it.
    pub fn with_ack_timeout(mut self, timeout: Duration) -> Self {
        self.jetstream.set_timeout(timeout);
        self.timeout = timeout;
        self
    }

    /// The JetStream context, for managing streams beside the sink.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// Creates the stream `name` capturing `subjects` with the given duplicate window, unless a
    /// stream of that name exists (which is then left as it is). For tests and demos; production
    /// streams are usually managed with the `nats` tool or infrastructure code.
    pub async fn ensure_stream(
        &self,
        name: &str,
        subjects: &[&str],
        duplicate_window: Duration,
    ) -> Result<(), NatsError> {
        let config = jetstream::stream::Config {
            name: name.to_owned(),
            subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
            duplicate_window,
            ..Default::default()
        };
        self.jetstream
            .get_or_create_stream(config)
            .await
            .map(|_| ())
            .map_err(|e| NatsError::Stream {
                name: name.to_owned(),
                message: e.to_string(),
            })
    }

    fn headers(&self, delivery: &Delivery) -> Result<HeaderMap, DeliveryError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &delivery.headers {
            if name.eq_ignore_ascii_case(NATS_MSG_ID) {
                continue; // the downstream key is the id; a header cannot override it
            }
            // A header NATS cannot carry is dropped rather than failing the delivery.
            if let (Ok(name), Ok(value)) =
                (name.parse::<HeaderName>(), value.parse::<HeaderValue>())
            {
                headers.insert(name, value);
            }
        }
        let id = delivery
            .downstream_key
            .parse::<HeaderValue>()
            .map_err(|_| {
                DeliveryError::permanent(format!(
                    "the downstream key {:?} cannot be a NATS header value",
                    delivery.downstream_key
                ))
            })?;
        headers.insert(NATS_MSG_ID, id);
        Ok(headers)
    }

    /// No responders on the subject: a missing stream (final) or a stream or JetStream that is
    /// momentarily not answering (retry).
    async fn no_responders(&self, subject: &str) -> DeliveryError {
        match self.jetstream.stream_by_subject(subject).await {
            Ok(stream) => DeliveryError::retryable(format!(
                "no responders for {subject}: stream {stream} captures it but did not answer"
            )),
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => {
                DeliveryError::permanent(format!(
                    "no JetStream stream captures subject {subject}: create one (or fix the \
                     subject), then replay the row"
                ))
            }
            Err(e) => DeliveryError::retryable(format!(
                "no responders for {subject}, and JetStream did not say whether a stream captures it: {e}"
            )),
        }
    }

    /// Publishes and waits for the ack; a no-responders answer is looked into.
    async fn publish(
        &self,
        subject: &str,
        publish: jetstream::message::PublishMessage,
    ) -> Result<Receipt, DeliveryError> {
        let ack = match self
            .jetstream
            .send_publish(subject.to_owned(), publish)
            .await
        {
            Ok(pending) => pending.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(ack) => Ok(Receipt::new(
                PublishReceipt {
                    stream: ack.stream,
                    seq: ack.sequence,
                    duplicate: ack.duplicate,
                }
                .to_string(),
            )),
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                Err(self.no_responders(subject).await)
            }
            Err(e) => Err(classify(&e, subject)),
        }
    }
}

#[async_trait::async_trait]
impl Sink for NatsSink {
    async fn deliver(&self, delivery: &Delivery) -> Result<Receipt, DeliveryError> {
        let message = NatsMessage::from_payload(&delivery.payload)
            .map_err(|e| DeliveryError::malformed_payload("txoutbox_nats::NatsMessage", e))?;
        let subject = message
            .subject
            .as_deref()
            .or(self.subject.as_deref())
            .ok_or_else(|| {
                DeliveryError::permanent(format!(
                    "the message names no subject and the sink for {:?} has none",
                    delivery.destination
                ))
            })?
            .to_owned();
        // The sink's own subject (the message's was checked with the payload).
        check_subject(&subject).map_err(|e| DeliveryError::permanent(e.to_string()))?;
        let payload = serde_json::to_vec(&message.data)
            .map_err(|e| DeliveryError::permanent(format!("serialising the message: {e}")))?;
        let publish = jetstream::message::PublishMessage::build()
            .payload(payload.into())
            .headers(self.headers(delivery)?);
        // The JetStream context bounds the wait for the ack, not the wait for an ack permit or
        // for room in the send buffer while the connection is down: bound the whole call, so the
        // timeout the relay is told of holds.
        match tokio::time::timeout(self.timeout, self.publish(&subject, publish)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(DeliveryError::retryable(format!(
                "JetStream publish to {subject}: no ack within {:?}",
                self.timeout
            ))),
        }
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }
}

/// Maps a publish failure (other than no responders) to what the relay should do.
fn classify(e: &PublishError, subject: &str) -> DeliveryError {
    let message = format!(
        "JetStream publish to {subject} failed: {}",
        txoutbox::sink::error_chain(e)
    );
    let permanent = match e.kind() {
        PublishErrorKind::MaxPayloadExceeded
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence => true,
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending
        | PublishErrorKind::StreamNotFound => false,
        PublishErrorKind::Other => std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .is_some_and(|js| PERMANENT_CODES.contains(&js.error_code())),
    };
    if permanent {
        DeliveryError::permanent(message)
    } else {
        DeliveryError::retryable(message)
    }
}

/// A publish subject: dot-separated non-empty tokens, no whitespace, no wildcards.
#[cfg(test)]
mod tests {
    use super::*;

    fn js_error(code: u64) -> PublishError {
        let error: jetstream::Error = serde_json::from_value(serde_json::json!({
            "code": 400, "err_code": code, "description": "rejected"
        }))
        .expect("a JetStream error");
        PublishError::with_source(PublishErrorKind::Other, error)
    }

    #[test]
    fn transient_failures_retry_and_final_rejections_do_not() {
        let retry = |e: PublishError| !classify(&e, "s").is_permanent();
        assert!(retry(PublishError::new(PublishErrorKind::TimedOut)));
        assert!(retry(PublishError::new(PublishErrorKind::BrokenPipe)));
        assert!(retry(PublishError::new(PublishErrorKind::MaxAckPending)));
        assert!(retry(js_error(ErrorCode::STREAM_STORE_FAILED.0)));
        assert!(retry(js_error(
            ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT.0
        )));
        assert!(!retry(PublishError::new(
            PublishErrorKind::MaxPayloadExceeded
        )));
        assert!(!retry(js_error(
            ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM.0
        )));
        assert!(!retry(js_error(ErrorCode::STREAM_SEALED.0)));
    }

    #[test]
    fn receipts_read_back() {
        let receipt = PublishReceipt {
            stream: "ORDERS".into(),
            seq: 7,
            duplicate: false,
        };
        assert_eq!(
            receipt.to_string(),
            r#"{"stream":"ORDERS","seq":7,"duplicate":false}"#
        );
        assert_eq!(
            PublishReceipt::parse(&receipt.to_string()).expect("parses"),
            receipt
        );
    }
}
