//! The `Idempotent` extractor and the three steps of an idempotent handler: begin (claim, replay
//! or refuse), the handler's own work, complete (store the answer and commit).

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use txoutbox::telemetry::TRACEPARENT;
use txoutbox::{
    Begin, Claim, CommitTx, Enqueued, Fingerprint, IdempotencyKey, Scope, StoredResponse, WriteTx,
};

use crate::{IdempotencyRejection, Problem};

/// The request header carrying the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The response header marking a replayed answer (as Stripe does).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// An idempotent request: its key, its fingerprint and its body, read once.
///
/// Extracting it consumes the body (use [`Idempotent::body`] or [`Idempotent::json`]). It rejects
/// ([`IdempotencyRejection`]) with 400 a request other than GET/HEAD without a key, any request with a malformed key, and
/// one with two `Idempotency-Key` fields (or a list in one). The key is read as
/// [`IdempotencyKey::from_header`] says: `"8e03978e-…"` (an RFC 8941 sf-string, as the
/// draft defines the header) and `8e03978e-…` (bare) are the same key. A key shorter than the
/// scope accepts ([`Scope::with_min_key_len`], 16 by default) is refused with 400 by
/// [`Idempotent::begin`].
#[derive(Debug, Clone)]
pub struct Idempotent {
    key: Option<IdempotencyKey>,
    fingerprint: Fingerprint,
    body: Bytes,
    traceparent: Option<String>,
}

/// The outcome of [`Idempotent::begin`].
#[derive(Debug)]
pub enum Started {
    /// The key is ours: do the work, enqueue effects on the claim, then complete.
    New(Claim),
    /// Nothing to do: the stored answer of an earlier try (marked replayed), or a 409/422.
    Answered(Response),
}

impl<S: Send + Sync> FromRequest<S> for Idempotent {
    type Rejection = IdempotencyRejection;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let method = request.method().clone();
        // The concrete path (and query): two items bought under one key are two requests.
        let route = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| request.uri().path().to_owned());
        let key = key_from(request.headers(), &method)?;
        // The caller's trace context, for the effects; a malformed one is ignored (W3C: a
        // receiver restarts the trace rather than refusing the request).
        let traceparent = request
            .headers()
            .get(TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .filter(|v| txoutbox::telemetry::Traceparent::parse(v.trim()).is_ok())
            .map(str::to_owned);
        let body = Bytes::from_request(request, state)
            .await
            .map_err(IdempotencyRejection::Body)?;
        Ok(Self {
            fingerprint: Fingerprint::new(method.as_str(), &route, &body),
            key,
            body,
            traceparent,
        })
    }
}

/// The request's key: one `Idempotency-Key` field holding one sf-string (or bare key).
fn key_from(
    headers: &HeaderMap,
    method: &Method,
) -> Result<Option<IdempotencyKey>, IdempotencyRejection> {
    let mut fields = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = fields.next() else {
        return if method == Method::GET || method == Method::HEAD {
            Ok(None)
        } else {
            Err(IdempotencyRejection::MissingKey)
        };
    };
    // The draft: a client MUST NOT send more than one; which one would be the key is a guess.
    if fields.next().is_some() {
        return Err(IdempotencyRejection::MultipleKeys);
    }
    let text = value
        .to_str()
        .map_err(|_| IdempotencyRejection::NotVisibleAscii)?;
    IdempotencyKey::from_header(text)
        .map(Some)
        .map_err(IdempotencyRejection::InvalidKey)
}

impl Idempotent {
    /// The request's key (`None` only for GET/HEAD sent without one).
    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// The request body as received.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body parsed as JSON; a body that does not parse is a 400 problem.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Problem> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// Claims the key inside `tx`. A replay, a mismatch (422) or a key in flight (409) comes
    /// back as [`Started::Answered`]: return it, and let `tx` drop (it rolls back).
    ///
    /// A new claim carries the request's `traceparent` header (when valid and the claim has no
    /// context yet), so the relay's deliveries of its effects continue the caller's trace.
    ///
    /// A GET/HEAD without a key has nothing to claim; use the core API for such reads, or send
    /// a key. Calling `begin` for one is a 400 problem.
    ///
    /// `tx` is the handler's transaction on any driver txoutbox speaks ([`WriteTx`]): `&tx` of a
    /// deadpool or tokio-postgres transaction, `&mut tx` of a `sqlx::Transaction<'_, Postgres>`
    /// (the `sqlx` feature).
    pub async fn begin(&self, tx: impl WriteTx, scope: &Scope) -> Result<Started, Problem> {
        let Some(key) = &self.key else {
            return Err(Problem::missing_key());
        };
        Ok(
            match txoutbox::begin(tx, scope, key, &self.fingerprint).await? {
                Begin::New(mut claim) => {
                    if let (None, Some(traceparent)) = (claim.traceparent(), &self.traceparent) {
                        claim.with_traceparent(traceparent)?;
                    }
                    Started::New(claim)
                }
                Begin::Replay(stored) => Started::Answered(replayed(stored)),
                Begin::Mismatch => Started::Answered(Problem::mismatch().into_response()),
                Begin::InFlight => Started::Answered(Problem::in_flight().into_response()),
            },
        )
    }

    /// Stores `response` with the key (with the claim's outbox rows) in `tx`, without
    /// committing: for a handler that wants a step between the two (see [`Prepared::commit`]),
    /// or whose `tx` is a nested transaction. A 5xx is not stored; its `commit` rolls back.
    pub async fn prepare(
        &self,
        tx: impl WriteTx,
        claim: Claim,
        response: impl IntoResponse,
    ) -> Result<Prepared, Problem> {
        let answer = Answer::read(response).await?;
        let mut enqueued = Enqueued::default();
        if let Some(stored) = &answer.stored {
            enqueued = claim.complete(tx, stored).await?;
        }
        Ok(Prepared {
            store: answer.stored.is_some(),
            response: answer.response,
            enqueued,
        })
    }

    /// Stores `response` with the key and commits `tx` in one round trip ([`Claim::commit`]),
    /// then returns the response; a 5xx rolls `tx` back instead (nothing is kept: the retry runs
    /// again). `tx` must be the outermost transaction (no savepoint open); for a nested one, use
    /// [`Idempotent::prepare`] and [`Prepared::commit`].
    ///
    /// On sqlx this takes two round trips (the statement, then COMMIT), and a nested
    /// transaction is refused before anything is sent.
    pub async fn complete(
        &self,
        tx: impl CommitTx,
        claim: Claim,
        response: impl IntoResponse,
    ) -> Result<Response, Problem> {
        let answer = Answer::read(response).await?;
        match &answer.stored {
            Some(stored) => {
                claim.commit(tx, stored).await?;
            }
            None => tx.rollback().await?,
        }
        Ok(answer.response)
    }
}

/// A handler's response, read whole: what is stored with the key (nothing for a 5xx) and what
/// is sent.
struct Answer {
    response: Response,
    stored: Option<StoredResponse>,
}

impl Answer {
    async fn read(response: impl IntoResponse) -> Result<Self, Problem> {
        let (parts, body) = response.into_response().into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.map_err(|e| {
            tracing::error!(error = %txoutbox::sink::error_chain(&e), "the handler's response body could not be read");
            Problem::blank(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the response could not be produced and the request was rolled back; it is \
                 safe to retry with the same key",
            )
        })?;
        let stored = (parts.status.as_u16() < 500).then(|| StoredResponse {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .filter(|(name, _)| kept(name))
                .filter_map(|(name, value)| {
                    Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                })
                .collect(),
            body: body.to_vec(),
        });
        Ok(Self {
            response: Response::from_parts(parts, Body::from(body)),
            stored,
        })
    }
}

/// A response stored in a transaction not yet committed.
#[derive(Debug)]
#[must_use = "commit the transaction with Prepared::commit"]
pub struct Prepared {
    response: Response,
    store: bool,
    enqueued: Enqueued,
}

impl Prepared {
    /// Commits `tx` (rolls it back for a 5xx) and gives back the response. A commit that fails
    /// for want of a connection is a 503: the outcome is unknown, the retry will tell.
    pub async fn commit(self, tx: impl CommitTx) -> Result<Response, Problem> {
        if self.store {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(self.response)
    }

    /// Which of the claim's effects were written, and which were skipped as already in the
    /// outbox (see [`Enqueued`]); nothing for a 5xx, which is rolled back.
    pub fn enqueued(&self) -> &Enqueued {
        &self.enqueued
    }

    /// The status about to be answered.
    pub fn status(&self) -> StatusCode {
        self.response.status()
    }
}

/// Headers that describe this transfer rather than the answer are not stored.
fn kept(name: &HeaderName) -> bool {
    name != header::CONTENT_LENGTH
        && name != header::TRANSFER_ENCODING
        && name != header::DATE
        && name != header::CONNECTION
        && name.as_str() != IDEMPOTENT_REPLAYED
}

fn replayed(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            headers.append(name, value);
        }
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}
