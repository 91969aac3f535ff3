//! The payload's checks and its MIME form, without a server.

use super::*;
use std::time::{Duration, UNIX_EPOCH};

fn email() -> Email {
    Email::new("Shop <shop@example.com>", "ada@example.org", "Your receipt").text("Thanks!")
}

fn formatted(email: &Email, key: &str) -> String {
    let (message, _) = email
        .to_message(key, None, UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .expect("builds");
    String::from_utf8(message.formatted()).expect("utf-8")
}

#[test]
fn a_bad_address_is_a_typed_error_naming_the_field() {
    let err = Email::new("not an address", "ada@example.org", "s")
        .text("t")
        .validate()
        .expect_err("refused");
    assert!(
        matches!(&err, EmailError::InvalidAddress { field: "from", address, .. } if address == "not an address"),
        "{err:?}"
    );
    let err = email()
        .cc("bob@")
        .into_outbox_message()
        .expect_err("refused");
    assert!(
        matches!(err, EmailError::InvalidAddress { field: "cc", .. }),
        "{err:?}"
    );
    let err = email().reply_to("@x.org").validate().expect_err("refused");
    assert!(
        matches!(
            err,
            EmailError::InvalidAddress {
                field: "reply-to",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn an_email_needs_a_body_and_a_recipient() {
    let err = Email::new("a@example.com", "b@example.com", "s")
        .validate()
        .expect_err("refused");
    assert!(matches!(err, EmailError::NoBody), "{err:?}");
    let mut e = email();
    e.to.clear();
    assert!(matches!(e.validate(), Err(EmailError::NoRecipient)));
}

#[test]
fn line_breaks_in_headers_are_refused() {
    let err = Email::new(
        "a@example.com",
        "b@example.com",
        "hi\r\nBcc: evil@example.net",
    )
    .text("t")
    .validate()
    .expect_err("refused");
    assert!(
        matches!(&err, EmailError::InvalidHeader { name, .. } if name == "Subject"),
        "{err:?}"
    );
    let err = email()
        .header("X-Tag", "a\nb")
        .validate()
        .expect_err("refused");
    assert!(matches!(err, EmailError::InvalidHeader { .. }), "{err:?}");
}

#[test]
fn custom_headers_cannot_replace_the_sinks_own_or_repeat() {
    for name in [
        "Message-ID",
        "message-id",
        "Idempotency-Key",
        "From",
        "Date",
    ] {
        let err = email().header(name, "x").validate().expect_err("refused");
        assert!(matches!(err, EmailError::InvalidHeader { .. }), "{name}");
    }
    for name in ["", "X Tag", "X:Tag"] {
        assert!(email().header(name, "x").validate().is_err(), "{name:?}");
    }
    let err = email()
        .header("X-Tag", "1")
        .header("x-tag", "2")
        .validate()
        .expect_err("refused");
    assert!(matches!(err, EmailError::InvalidHeader { .. }), "{err:?}");
}

#[test]
fn the_payload_round_trips_through_json() {
    let e = email()
        .to("bob@example.org")
        .cc("Carol <carol@example.org>")
        .bcc("audit@example.com")
        .reply_to("support@example.com")
        .html("<p>Thanks!</p>")
        .header("X-Campaign", "spring");
    let json = serde_json::to_value(&e).expect("serialises");
    assert_eq!(
        json["to"],
        serde_json::json!(["ada@example.org", "bob@example.org"])
    );
    assert_eq!(
        json["headers"],
        serde_json::json!([["X-Campaign", "spring"]])
    );
    let back: Email = serde_json::from_value(json).expect("deserialises");
    assert_eq!(back, e);
    let minimal: Email = serde_json::from_value(serde_json::json!({
        "from": "a@example.com", "to": ["b@example.com"], "subject": "s", "text": "t"
    }))
    .expect("optional fields may be absent");
    assert!(minimal.validate().is_ok());
    let unknown = serde_json::from_value::<Email>(serde_json::json!({
        "from": "a@example.com", "to": ["b@example.com"], "subject": "s", "text": "t",
        "attachments": []
    }));
    assert!(unknown.is_err(), "an unknown field is not silently dropped");
}

#[test]
fn the_outbox_message_goes_to_the_email_destination() {
    let message = email().into_outbox_message().expect("valid");
    assert_eq!(message.destination(), "email");
}

#[test]
fn the_message_id_and_idempotency_key_come_from_the_key() {
    let key = "6a1f3c2e-8b4d-4e7a-9c15-2f0b7d3e91a4";
    let text = formatted(&email(), key);
    assert!(
        text.contains(&format!("Message-ID: <{key}@example.com>\r\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("Idempotency-Key: {key}\r\n")),
        "{text}"
    );
    let (_, id) = email()
        .to_message(key, Some("mail.shop.example"), SystemTime::now())
        .expect("builds");
    assert_eq!(id, format!("<{key}@mail.shop.example>"));
}

#[test]
fn every_attempt_builds_the_same_bytes() {
    let e = email().html("<p>Thanks!</p>").cc("bob@example.org");
    assert_eq!(formatted(&e, "k-1"), formatted(&e, "k-1"));
    assert_ne!(formatted(&e, "k-1"), formatted(&e, "k-2"));
}

#[test]
fn bcc_is_in_the_envelope_but_not_the_headers() {
    let (message, _) = email()
        .bcc("audit@example.com")
        .to_message("k", None, SystemTime::now())
        .expect("builds");
    let rcpt: Vec<String> = message
        .envelope()
        .to()
        .iter()
        .map(|a| a.to_string())
        .collect();
    assert_eq!(rcpt, ["ada@example.org", "audit@example.com"]);
    let text = String::from_utf8(message.formatted()).expect("utf-8");
    assert!(!text.contains("audit@example.com"), "{text}");
}

#[test]
fn a_bad_message_id_domain_is_refused() {
    let err = email()
        .to_message("k", Some("not a domain"), SystemTime::now())
        .expect_err("refused");
    assert!(matches!(err, EmailError::InvalidDomain { .. }), "{err:?}");
}
