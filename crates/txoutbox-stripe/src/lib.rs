//! txoutbox sink for Stripe: confirmed PaymentIntents and refunds, created once however often
//! the relay delivers them.
//!
//! ```no_run
//! # #[cfg(feature = "sink")]
//! use txoutbox_stripe::{NewPaymentIntent, StripeSink, DESTINATION};
//!
//! # #[cfg(feature = "sink")]
//! # async fn demo(tx: &tokio_postgres::Transaction<'_>, pg: tokio_postgres::Config)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! // In the business transaction: the charge is an outbox row, committed with the order.
//! let charge = NewPaymentIntent::new(2000, "usd")
//!     .with_customer("cus_123")
//!     .with_payment_method("pm_card_visa")
//!     .with_metadata("order_id", "42")
//!     .into_outbox_message()?
//!     .with_downstream_key("order-42-charge"); // or Claim::enqueue, which derives one
//! txoutbox::enqueue(tx, &[charge]).await?;
//!
//! // In the relay: STRIPE_SECRET_KEY, and STRIPE_API_BASE to point it elsewhere.
//! let relay = txoutbox::relay::Relay::builder(pg)
//!     .sink(DESTINATION, StripeSink::from_env()?)
//!     .build()?;
//! # let _ = relay;
//! # Ok(())
//! # }
//! ```
//!
//! Every attempt of a row sends the row's downstream key as Stripe's `Idempotency-Key`, so a
//! redelivery (after a timeout, or a relay that crashed between Stripe's answer and its own
//! commit) is answered with the object Stripe created the first time. The receipt stored with
//! the delivered row is that object's id (`pi_...`, `re_...`). A declined card or any other
//! 4xx dead-letters the row at once with Stripe's code in `last_error`
//! (`card_declined: Your card was declined.`); 409, 429, 5xx, timeouts and connection failures
//! are retried with the relay's backoff, or after `Retry-After` when Stripe sends one.
//!
//! # Without the delivery stack
//!
//! The `sink` feature (on by default) carries `StripeSink` and its HTTP stack (async-stripe's
//! typed requests, reqwest, rustls). A service that only enqueues Stripe calls depends on
//! `txoutbox-stripe = { version = "0.1", default-features = false }`: the payloads, their
//! checks, [`check`] and `into_outbox_message` are there. The sink checks every row the same
//! way before it calls Stripe; a row that fails is dead-lettered with `malformed payload (build
//! it with txoutbox_stripe::NewPaymentIntent or txoutbox_stripe::NewRefund): ...`.
//!
//! Layout: `message` holds the payloads ([`StripeRequest`], [`NewPaymentIntent`],
//! [`NewRefund`]), their checks ([`check`], [`PayloadError`]) and (feature `sink`) their
//! mapping onto async-stripe's typed requests; `transport` sends those
//! requests through async-stripe's `StripeClient` trait over reqwest (keeping the headers and
//! statuses async-stripe's own client drops); `classify` ([`classify`], [`StripeFailure`]) turns
//! a failed call into retry or dead letter; `sink` ([`StripeSink`]) is the relay's entry point.
//! Tests run against the fake Stripe API in `txoutbox-test-support` (`fake_stripe`).

#[cfg(feature = "sink")]
mod classify;
mod message;
#[cfg(feature = "sink")]
mod sink;
#[cfg(feature = "sink")]
mod transport;

#[cfg(feature = "sink")]
pub use classify::{classify, ApiError, StripeFailure};
pub use message::{check, NewPaymentIntent, NewRefund, PayloadError, StripeRequest, DESTINATION};
#[cfg(feature = "sink")]
pub use sink::{ConfigError, StripeSink, DEFAULT_API_BASE, DEFAULT_TIMEOUT};
