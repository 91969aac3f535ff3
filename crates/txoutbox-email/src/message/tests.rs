//! The payload's checks and its MIME form, without a server.

use super::*;

fn email() -> Email {
    Email::new("Shop <shop@example.com>", "ada@example.org", "Your receipt").text("Thanks!")
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
    let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<EmailError>());
    assert!(
        matches!(source, Some(EmailError::InvalidAddress { field: "cc", .. })),
        "{err:?}"
    );
    assert_eq!(err.http_status(), 422);
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
fn check_accepts_a_built_email_and_refuses_a_wrong_shape() {
    let built = email()
        .cc("bob@example.org")
        .into_outbox_message()
        .expect("valid");
    crate::check(built.payload()).expect("a built email passes the check");
    // `to` is a list; a bare string is the wrong shape, and so is a misspelt field.
    let wrong = serde_json::json!({
        "from": "shop@example.com", "to": "ada@example.org", "subject": "s", "text": "t"
    });
    assert!(
        matches!(crate::check(&wrong), Err(EmailError::NotAnEmail(_))),
        "{:?}",
        crate::check(&wrong)
    );
    let misspelt = serde_json::json!({
        "from": "shop@example.com", "to": ["ada@example.org"], "subject": "s", "txt": "t"
    });
    assert!(matches!(
        crate::check(&misspelt),
        Err(EmailError::NotAnEmail(_))
    ));
    // The right shape with a refused value fails as the builder would.
    let bad_address = serde_json::json!({
        "from": "shop@example.com", "to": ["ada@"], "subject": "s", "text": "t"
    });
    assert!(matches!(
        crate::check(&bad_address),
        Err(EmailError::InvalidAddress { field: "to", .. })
    ));
    let converted = txoutbox::Error::from(crate::check(&wrong).expect_err("refused"));
    assert_eq!(converted.http_status(), 422);
}
