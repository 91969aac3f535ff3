//! The sink's configuration and its refusals, without a server.

use super::*;

#[tokio::test]
async fn smtp_urls_are_checked_before_anything_connects() {
    for bad in ["http://mail.example.com", "not a url", "smtp://"] {
        let err = EmailSink::smtp(bad).expect_err("refused");
        assert!(matches!(err, EmailError::Config(_)), "{bad}: {err:?}");
    }
    let err = EmailSink::smtp("smtp://mail.example.com?tls=sometimes").expect_err("refused");
    assert!(matches!(err, EmailError::Config(_)), "{err:?}");
    for good in [
        "smtp://127.0.0.1:2525",
        "smtp://user:secret@mail.example.com:587?tls=required",
        "smtp://mail.example.com:587?tls=opportunistic",
        "smtps://user:secret@mail.example.com",
    ] {
        let sink = EmailSink::smtp(good).expect(good);
        assert!(!format!("{sink:?}").contains("secret"), "{sink:?}");
    }
}

#[test]
fn smtp_outside_a_runtime_is_an_error_not_a_panic() {
    let err = EmailSink::smtp("smtp://127.0.0.1:2525").expect_err("refused");
    assert!(matches!(err, EmailError::Config(_)), "{err:?}");
}

#[tokio::test]
async fn a_payload_that_is_not_an_email_is_permanent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = EmailSink::file_dir(dir.path()).expect("sink");
    let mut delivery = Delivery {
        id: uuid::Uuid::now_v7(),
        destination: "email".to_owned(),
        payload: serde_json::json!({ "to": "nobody" }),
        headers: Default::default(),
        downstream_key: "k".to_owned(),
        ordering_key: None,
        attempt: 1,
        created_at: chrono::Utc::now(),
    };
    let err = sink.deliver(&delivery).await.expect_err("refused");
    assert!(err.is_permanent(), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("malformed payload (build it with txoutbox_email::Email): "),
        "{err}"
    );
    delivery.payload = serde_json::json!({
        "from": "shop@example.com", "to": ["not-an-address"], "subject": "s", "text": "t"
    });
    let err = sink.deliver(&delivery).await.expect_err("refused");
    assert!(err.is_permanent(), "{err:?}");
    assert!(err.to_string().contains("not-an-address"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
}

#[tokio::test]
async fn from_env_prefers_smtp_url_with_its_helo_name_then_mail_dir_and_refuses_neither() {
    // The only test touching these variables; nextest runs it in a process of its own.
    let dir = tempfile::tempdir().expect("tempdir");
    std::env::remove_var(SMTP_URL_VAR);
    std::env::remove_var(MAIL_DIR_VAR);
    std::env::remove_var(SMTP_HELO_NAME_VAR);
    assert!(matches!(EmailSink::from_env(), Err(EmailError::Config(_))));
    std::env::set_var(MAIL_DIR_VAR, dir.path());
    let sink = EmailSink::from_env().expect("file sink");
    assert!(matches!(sink.transport, Transport::File { .. }), "{sink:?}");
    std::env::set_var(SMTP_URL_VAR, "smtp://127.0.0.1:2525");
    let sink = EmailSink::from_env().expect("smtp sink");
    assert!(matches!(sink.transport, Transport::Smtp { .. }), "{sink:?}");

    std::env::set_var(SMTP_HELO_NAME_VAR, " relay1.example.com ");
    let sink = EmailSink::from_env_with(SmtpConfig {
        hello_name: Some("replaced.example.com".to_owned()),
        ..SmtpConfig::default()
    })
    .expect("smtp sink");
    let shown = format!("{sink:?}");
    assert!(shown.contains("\"relay1.example.com\""), "{shown}");
    std::env::set_var(SMTP_HELO_NAME_VAR, "relay1");
    match EmailSink::from_env() {
        Err(EmailError::Config(line)) => assert!(
            line.starts_with("SMTP_HELO_NAME \"relay1\"") && !line.contains('\n'),
            "{line}"
        ),
        other => panic!("a single-label SMTP_HELO_NAME was accepted: {other:?}"),
    }
    std::env::remove_var(SMTP_HELO_NAME_VAR);
    std::env::remove_var(SMTP_URL_VAR);
    std::env::remove_var(MAIL_DIR_VAR);
}

#[test]
fn a_message_id_domain_must_be_a_domain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = EmailSink::file_dir(dir.path()).expect("sink");
    assert!(matches!(
        sink.with_message_id_domain("two words"),
        Err(EmailError::InvalidDomain { .. })
    ));
}

#[test]
fn message_ids_use_the_configured_domain_or_the_from_domain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let email = Email::new("shop@example.com", "ada@example.org", "s").text("t");
    let sink = EmailSink::file_dir(dir.path()).expect("sink");
    assert_eq!(
        sink.message_id_for(&email, "k1").expect("id"),
        "<k1@example.com>"
    );
    let sink = sink
        .with_message_id_domain("mail.example.net")
        .expect("domain");
    assert_eq!(
        sink.message_id_for(&email, "k1").expect("id"),
        "<k1@mail.example.net>"
    );
}
