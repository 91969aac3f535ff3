//! The MIME form, without a server.

use super::*;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// The builder (without lettre), lettre's own parser and the sink's MIME build accept and refuse
/// the same addresses, so an email checked when it is built is never refused by the sink for
/// its addresses, and a row lettre accepted before is still delivered.
#[test]
fn the_builder_and_the_sink_agree_on_which_addresses_are_valid() {
    let good = [
        "ada@example.org",
        "Ada Lovelace <ada@example.org>",
        "\"Lovelace, Ada\" <ada@example.org>",
        "  ada@example.org  ",
        "<ada@example.org>",
        "Zoë Ünal <zoe@example.org>",
        "a.b+tag@sub.example.co.uk",
        "josé@example.com",
        "ada@bücher.example",
        "ada@192.0.2.1",
        "ada@localhost",
        "Dr. Ada Lovelace <ada@example.org>",
        "o'brien@example.ie",
    ];
    let bad = [
        "",
        "not an address",
        "ada",
        "ada@",
        "@example.org",
        "ada@@example.org",
        "ada@example..org",
        "ada@-example.org",
        "ada@example.org-",
        "<ada@example.org",
        "Ada <ada@example.org> trailing",
        "ada example@example.org",
        "\"john doe\"@example.org",
        "ada@exa mple.org",
        "a\r\nb@example.org",
        "ada@example.org, bob@example.org",
        ".ada@example.org",
        "ada.@example.org",
        "ada@[192.0.2.1]",
    ];
    let cases = good
        .iter()
        .map(|a| (a, true))
        .chain(bad.iter().map(|a| (a, false)));
    for (address, expected) in cases {
        let lettre_reads = address.trim().parse::<lettre::message::Mailbox>().is_ok();
        let email = Email::new(*address, "ada@example.org", "s").text("t");
        let builder_accepts = email.validate().is_ok();
        let sink_builds = email
            .to_message("k", Some("example.com"), SystemTime::now())
            .is_ok();
        assert_eq!(
            (lettre_reads, builder_accepts, sink_builds),
            (expected, expected, expected),
            "{address:?}: (lettre, builder, sink)"
        );
    }
}
