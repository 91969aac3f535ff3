//! The HTTP client async-stripe's requests are sent with.
//!
//! async-stripe builds each request (path, Stripe's form encoding) and parses the answer; this
//! module sends it, through async-stripe's `StripeClient` trait. Its own hyper client would do
//! too, but it drops what the relay needs to decide: the response headers (`Retry-After`,
//! `Idempotent-Replayed`) and, for an error body that is not Stripe's JSON (a proxy's 502 page),
//! the status itself. This one keeps them, and refuses to POST without a caller-chosen
//! `Idempotency-Key`: a generated key would change on every redelivery and defeat Stripe's
//! deduplication.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use stripe_client_core::{CustomizedStripeRequest, RequestStrategy, StripeClient, StripeMethod};

use txoutbox::sink::parse_retry_after;

use crate::classify::{ApiError, StripeFailure};

const USER_AGENT: &str = concat!("txoutbox-stripe/", env!("CARGO_PKG_VERSION"));

impl stripe_client_core::StripeClientErr for StripeFailure {
    fn deserialize_err(msg: impl std::fmt::Display) -> Self {
        StripeFailure::Response(msg.to_string())
    }
}

/// An HTTP client bound to one API base and one secret key.
#[derive(Clone)]
pub(crate) struct Transport {
    http: reqwest::Client,
    /// `Bearer sk_...`, marked sensitive so that it is never printed.
    authorization: HeaderValue,
    /// Without a trailing slash: `https://api.stripe.com`.
    pub(crate) api_base: String,
    pub(crate) timeout: Duration,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("api_base", &self.api_base)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// A client over rustls with the ring provider and the platform's certificate roots
    /// (chosen here rather than installed process-wide, so an application's own choice of a
    /// rustls provider is left alone).
    pub(crate) fn new(
        secret_key: &str,
        api_base: String,
        timeout: Duration,
    ) -> Result<Self, String> {
        use rustls_platform_verifier::BuilderVerifierExt;
        let mut tls =
            rustls::ClientConfig::builder_with_provider(txoutbox::sink::crypto_provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS versions: {e}"))?
                .with_platform_verifier()
                .map_err(|e| format!("TLS certificate verifier: {e}"))?
                .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .user_agent(USER_AGENT)
            .connect_timeout(Duration::from_secs(5).min(timeout))
            // Stripe never redirects; following one would send the key elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        let mut authorization = HeaderValue::try_from(format!("Bearer {secret_key}"))
            .map_err(|_| "the secret key is not a valid header value".to_owned())?;
        authorization.set_sensitive(true);
        Ok(Self {
            http,
            authorization,
            api_base,
            timeout,
        })
    }

    async fn send(&self, request: CustomizedStripeRequest) -> Result<bytes::Bytes, StripeFailure> {
        let (request, config) = request.into_pieces();
        let key = match (&request.method, config.request_strategy) {
            (_, Some(RequestStrategy::Idempotent(key))) => Some(key),
            (StripeMethod::Get, None | Some(RequestStrategy::Once)) => None,
            (_, strategy) => {
                return Err(StripeFailure::Request(format!(
                    "{:?} {} without a caller-chosen Idempotency-Key (strategy {strategy:?})",
                    request.method, request.path
                )))
            }
        };
        let mut url = format!("{}/v1{}", self.api_base, request.path);
        if let Some(query) = &request.query {
            url.push('?');
            url.push_str(query);
        }
        let method = match request.method {
            StripeMethod::Get => reqwest::Method::GET,
            StripeMethod::Post => reqwest::Method::POST,
            StripeMethod::Delete => reqwest::Method::DELETE,
        };
        let timeout = config.timeout.unwrap_or(self.timeout);
        let mut builder = self
            .http
            .request(method, &url)
            .timeout(timeout)
            .header(AUTHORIZATION, self.authorization.clone())
            .header("Stripe-Version", stripe_client_core::VERSION.as_str());
        if let Some(key) = &key {
            builder = builder.header("Idempotency-Key", key.as_str());
        }
        if let Some(account) = &config.account_id {
            builder = builder.header("Stripe-Account", account.as_str());
        }
        if let Some(body) = request.body {
            builder = builder
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(body);
        }
        let failed = |e: reqwest::Error| {
            if e.is_timeout() {
                StripeFailure::Timeout(timeout)
            } else {
                StripeFailure::Transport(txoutbox::sink::error_chain(&e))
            }
        };
        let response = builder.send().await.map_err(failed)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(failed)?;
        if status.is_success() {
            tracing::debug!(
                %url,
                status = status.as_u16(),
                replayed = header(&headers, "idempotent-replayed") == Some("true"),
                "Stripe answered"
            );
            return Ok(body);
        }
        let retry_after = header(&headers, RETRY_AFTER.as_str())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        Err(StripeFailure::Api(ApiError::from_body(
            status.as_u16(),
            &body,
            retry_after,
        )))
    }
}

impl StripeClient for Transport {
    type Err = StripeFailure;

    fn execute(
        &self,
        request: CustomizedStripeRequest,
    ) -> impl std::future::Future<Output = Result<bytes::Bytes, StripeFailure>> + Send {
        self.send(request)
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}
