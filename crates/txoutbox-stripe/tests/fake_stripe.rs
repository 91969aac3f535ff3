//! The fake Stripe API behaves like Stripe where the sink's tests depend on it: raw HTTP
//! requests, no sink involved.

use std::time::Duration;

use serde_json::Value;
use txoutbox_test_support::eventually;
use txoutbox_test_support::fake_stripe::FakeStripe;

type TestResult = anyhow::Result<()>;

fn http() -> anyhow::Result<reqwest::Client> {
    // The crate's reqwest has no built-in TLS provider; loopback HTTP needs none, but reqwest
    // wants one to build a client.
    txoutbox::sink::ensure_crypto_provider();
    Ok(reqwest::Client::builder().build()?)
}

async fn post(
    fake: &FakeStripe,
    path: &str,
    key: Option<&str>,
    form: &[(&str, &str)],
) -> anyhow::Result<(u16, reqwest::header::HeaderMap, Value)> {
    let body: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let mut request = http()?
        .post(format!("{}{path}", fake.base_url()))
        .bearer_auth(fake.secret_key())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    Ok((
        status,
        headers,
        serde_json::from_slice(&response.bytes().await?)?,
    ))
}

const INTENT: &[(&str, &str)] = &[
    ("amount", "2000"),
    ("currency", "usd"),
    ("confirm", "true"),
    ("payment_method", "pm_card_visa"),
    ("metadata[order]", "42"),
    ("metadata[shop]", "north"),
];

#[tokio::test]
async fn a_request_without_the_secret_key_is_401_in_stripes_error_shape() -> TestResult {
    let fake = FakeStripe::start().await?;
    let response = http()?
        .post(format!("{}/v1/payment_intents", fake.base_url()))
        .bearer_auth("sk_test_someone_else")
        .form_body("amount=100&currency=usd")
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = serde_json::from_slice(&response.bytes().await?)?;
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("Invalid API Key provided")));
    assert_eq!(fake.created_count(), 0);
    Ok(())
}

trait FormBody {
    fn form_body(self, body: &'static str) -> Self;
}

impl FormBody for reqwest::RequestBuilder {
    fn form_body(self, body: &'static str) -> Self {
        self.header("content-type", "application/x-www-form-urlencoded")
            .body(body)
    }
}

#[tokio::test]
async fn same_key_and_parameters_in_any_order_replay_the_first_intent() -> TestResult {
    let fake = FakeStripe::start().await?;
    let (status, first_headers, first) =
        post(&fake, "/v1/payment_intents", Some("k-1"), INTENT).await?;
    assert_eq!(status, 200);
    assert_eq!(first["status"], "succeeded");
    assert_eq!(first["metadata"]["order"], "42");
    assert!(first_headers.get("idempotent-replayed").is_none());
    let mut reordered = INTENT.to_vec();
    reordered.reverse();
    let (status, headers, again) =
        post(&fake, "/v1/payment_intents", Some("k-1"), &reordered).await?;
    assert_eq!(status, 200);
    assert_eq!(again["id"], first["id"]);
    assert_eq!(
        headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(fake.intents().len(), 1);
    Ok(())
}

#[tokio::test]
async fn same_key_with_other_parameters_is_an_idempotency_error() -> TestResult {
    let fake = FakeStripe::start().await?;
    post(&fake, "/v1/payment_intents", Some("k-1"), INTENT).await?;
    let mut other = INTENT.to_vec();
    other[0] = ("amount", "2001");
    let (status, _, body) = post(&fake, "/v1/payment_intents", Some("k-1"), &other).await?;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "idempotency_error");
    assert_eq!(fake.intents().len(), 1);
    Ok(())
}

#[tokio::test]
async fn same_key_while_the_first_request_runs_is_409_key_in_use() -> TestResult {
    let fake = FakeStripe::start().await?;
    fake.set_latency(Duration::from_millis(500));
    let first = {
        let url = format!("{}/v1/payment_intents", fake.base_url());
        let key = fake.secret_key();
        tokio::spawn(async move {
            http()?
                .post(url)
                .bearer_auth(key)
                .header("idempotency-key", "k-1")
                .form_body("amount=100&currency=usd&confirm=true&payment_method=pm_card_visa")
                .send()
                .await
                .map(|r| r.status().as_u16())
                .map_err(anyhow::Error::from)
        })
    };
    eventually("the first request holds the key", || {
        fake.key_in_progress("k-1")
    })
    .await?;
    let (status, _, body) = post(
        &fake,
        "/v1/payment_intents",
        Some("k-1"),
        &[
            ("amount", "100"),
            ("currency", "usd"),
            ("confirm", "true"),
            ("payment_method", "pm_card_visa"),
        ],
    )
    .await?;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "idempotency_key_in_use");
    assert_eq!(first.await??, 200);
    assert_eq!(fake.intents().len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_declining_test_card_is_402_card_declined_and_the_answer_is_cached() -> TestResult {
    let fake = FakeStripe::start().await?;
    let declined = [
        ("amount", "100"),
        ("currency", "usd"),
        ("confirm", "true"),
        ("payment_method", "pm_card_chargeDeclined"),
    ];
    let (status, _, body) = post(&fake, "/v1/payment_intents", Some("k-1"), &declined).await?;
    assert_eq!(status, 402);
    assert_eq!(body["error"]["type"], "card_error");
    assert_eq!(body["error"]["code"], "card_declined");
    assert_eq!(body["error"]["decline_code"], "generic_decline");
    let (status, headers, _) = post(&fake, "/v1/payment_intents", Some("k-1"), &declined).await?;
    assert_eq!(status, 402);
    assert!(headers.get("idempotent-replayed").is_some());
    assert_eq!(fake.intents().len(), 1);
    assert_eq!(fake.intents()[0]["status"], "requires_payment_method");
    Ok(())
}

#[tokio::test]
async fn injected_failures_create_nothing_and_carry_retry_after() -> TestResult {
    let fake = FakeStripe::start().await?;
    fake.fail_next_with_retry_after(429, 1, Duration::from_secs(2));
    let (status, headers, body) = post(&fake, "/v1/payment_intents", Some("k-1"), INTENT).await?;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["code"], "rate_limit");
    assert_eq!(
        headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("2")
    );
    assert_eq!(fake.created_count(), 0);
    let (status, headers, _) = post(&fake, "/v1/payment_intents", Some("k-1"), INTENT).await?;
    assert_eq!(status, 200);
    assert!(
        headers.get("idempotent-replayed").is_none(),
        "a failure before the endpoint is not cached"
    );
    Ok(())
}

#[tokio::test]
async fn the_fakes_objects_parse_as_async_stripes_types_and_read_back() -> TestResult {
    let fake = FakeStripe::start().await?;
    let (_, _, created) = post(&fake, "/v1/payment_intents", Some("k-1"), INTENT).await?;
    let intent: stripe_core::PaymentIntent = miniserde::json::from_str(&created.to_string())?;
    assert_eq!(intent.amount, 2000);
    let id = created["id"].as_str().unwrap_or_default();
    let response = http()?
        .get(format!("{}/v1/payment_intents/{id}", fake.base_url()))
        .bearer_auth(fake.secret_key())
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&response.bytes().await?)?,
        created
    );
    let (status, _, refund) = post(
        &fake,
        "/v1/refunds",
        Some("k-2"),
        &[("payment_intent", id), ("amount", "500")],
    )
    .await?;
    assert_eq!(status, 200);
    let refund: stripe_core::Refund = miniserde::json::from_str(&refund.to_string())?;
    assert_eq!(refund.amount, 500);
    Ok(())
}
