//! The email payload: what a business transaction enqueues, and its checks. With the `sink`
//! feature, `mime` turns it into a MIME message with the row's Message-ID.

use serde::{Deserialize, Serialize};

use crate::address::{self, Mailbox};
use crate::EmailError;

#[cfg(feature = "sink")]
mod mime;

/// The destination name of email rows: register [`crate::EmailSink`] under it.
pub const DESTINATION: &str = "email";

/// Headers the sink writes itself; a custom header may not replace them.
const RESERVED_HEADERS: &[&str] = &[
    "From",
    "Sender",
    "To",
    "Cc",
    "Bcc",
    "Reply-To",
    "Subject",
    "Date",
    "Message-ID",
    "Idempotency-Key",
    "MIME-Version",
    "Content-Type",
    "Content-Transfer-Encoding",
];

/// One email, as stored in an outbox row's payload (JSON, via serde).
///
/// Addresses are `addr@domain` or `Display Name <addr@domain>`. Build it with [`Email::new`] and
/// the chained setters; [`Email::into_outbox_message`] checks it and makes the outbox row. Nothing is
/// checked before that, so a setter never fails; a payload that reaches the sink and does not
/// pass the same checks is dead-lettered, and so is one with a field this version does not know
/// (better than sending the email without it; replay the row once the relay is upgraded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Email {
    from: String,
    to: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cc: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    bcc: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reply_to: Option<String>,
    subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    html: Option<String>,
    /// Custom headers as `[name, value]` pairs, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    headers: Vec<(String, String)>,
}

/// The addresses of an [`Email`], parsed.
#[cfg_attr(not(feature = "sink"), allow(dead_code))]
struct Mailboxes {
    from: Mailbox,
    to: Vec<Mailbox>,
    cc: Vec<Mailbox>,
    bcc: Vec<Mailbox>,
    reply_to: Option<Mailbox>,
}

impl Email {
    /// An email from `from` to `to` about `subject`; add a body with [`Email::text`] and/or
    /// [`Email::html`].
    pub fn new(from: impl Into<String>, to: impl Into<String>, subject: impl Into<String>) -> Self {
        Self {
            from: from.into(),
            to: vec![to.into()],
            cc: Vec::new(),
            bcc: Vec::new(),
            reply_to: None,
            subject: subject.into(),
            text: None,
            html: None,
            headers: Vec::new(),
        }
    }

    /// Adds a `To` recipient.
    pub fn to(mut self, address: impl Into<String>) -> Self {
        self.to.push(address.into());
        self
    }

    /// Adds a `Cc` recipient.
    pub fn cc(mut self, address: impl Into<String>) -> Self {
        self.cc.push(address.into());
        self
    }

    /// Adds a `Bcc` recipient (in the SMTP envelope only, never in the headers).
    pub fn bcc(mut self, address: impl Into<String>) -> Self {
        self.bcc.push(address.into());
        self
    }

    /// Sets `Reply-To`.
    pub fn reply_to(mut self, address: impl Into<String>) -> Self {
        self.reply_to = Some(address.into());
        self
    }

    /// Sets the text/plain body.
    pub fn text(mut self, body: impl Into<String>) -> Self {
        self.text = Some(body.into());
        self
    }

    /// Sets the text/html body (with a text body too, the message is multipart/alternative).
    pub fn html(mut self, body: impl Into<String>) -> Self {
        self.html = Some(body.into());
        self
    }

    /// Adds a custom header (`X-Campaign: spring`). Names are RFC 5322 field names, given once;
    /// the headers the sink writes itself (From, To, Subject, Message-ID, Idempotency-Key, Date,
    /// the MIME headers, ...) cannot be set this way.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The `From` address, as given.
    pub fn from_address(&self) -> &str {
        &self.from
    }

    /// The `To` addresses, as given.
    pub fn to_addresses(&self) -> &[String] {
        &self.to
    }

    /// The subject.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Checks every address, header and the body, without building anything.
    pub fn validate(&self) -> Result<(), EmailError> {
        self.mailboxes().map(|_| ())?;
        self.check_content()
    }

    /// Checks the email and makes the outbox row for [`DESTINATION`] ("email"). Give it a
    /// downstream key (`with_downstream_key`) when enqueueing outside an idempotent request;
    /// the key becomes the Message-ID.
    ///
    /// A refused email is [`txoutbox::Error::InvalidPayload`] with the [`EmailError`] as its
    /// source: `?` in a handler answers it as a 422 problem (txoutbox-axum).
    pub fn into_outbox_message(self) -> txoutbox::Result<txoutbox::OutboxMessage> {
        self.validate()?;
        txoutbox::OutboxMessage::new(DESTINATION, &self)
    }

    /// The email in an outbox row's payload, checked as [`Email::into_outbox_message`] checks
    /// it: what the sink delivers, and what [`crate::check`] accepts.
    pub fn from_payload(payload: &serde_json::Value) -> Result<Self, EmailError> {
        let email = Self::deserialize(payload).map_err(EmailError::NotAnEmail)?;
        email.validate()?;
        Ok(email)
    }

    /// The domain of the `From` address (the default Message-ID domain).
    #[cfg_attr(not(feature = "sink"), allow(dead_code))]
    pub(crate) fn sender_domain(&self) -> Result<String, EmailError> {
        Ok(parse_mailbox("from", &self.from)?.domain)
    }

    fn mailboxes(&self) -> Result<Mailboxes, EmailError> {
        if self.to.is_empty() {
            return Err(EmailError::NoRecipient);
        }
        let many = |field: &'static str, list: &[String]| {
            list.iter()
                .map(|a| parse_mailbox(field, a))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Mailboxes {
            from: parse_mailbox("from", &self.from)?,
            to: many("to", &self.to)?,
            cc: many("cc", &self.cc)?,
            bcc: many("bcc", &self.bcc)?,
            reply_to: self
                .reply_to
                .as_deref()
                .map(|a| parse_mailbox("reply-to", a))
                .transpose()?,
        })
    }

    fn check_content(&self) -> Result<(), EmailError> {
        if self.text.is_none() && self.html.is_none() {
            return Err(EmailError::NoBody);
        }
        check_header_value("Subject", &self.subject)?;
        let mut seen: Vec<&str> = Vec::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            check_header_name(name)?;
            if seen.iter().any(|s| s.eq_ignore_ascii_case(name)) {
                return Err(EmailError::InvalidHeader {
                    name: name.clone(),
                    reason: "given more than once".to_owned(),
                });
            }
            seen.push(name);
            check_header_value(name, value)?;
        }
        Ok(())
    }
}

fn parse_mailbox(field: &'static str, text: &str) -> Result<Mailbox, EmailError> {
    address::parse(text).map_err(|e| EmailError::InvalidAddress {
        field,
        address: text.to_owned(),
        reason: e.to_string(),
    })
}

fn check_header_name(name: &str) -> Result<(), EmailError> {
    let invalid = |reason: &str| EmailError::InvalidHeader {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    // RFC 5322 field-name: printable ASCII but the colon; lettre folds at 76.
    if name.is_empty() || name.len() > 76 {
        return Err(invalid("a header name has 1 to 76 characters"));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err(invalid(
            "a header name is printable ASCII without spaces or ':'",
        ));
    }
    if RESERVED_HEADERS
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
    {
        return Err(invalid("the sink writes this header itself"));
    }
    Ok(())
}

fn check_header_value(name: &str, value: &str) -> Result<(), EmailError> {
    // A line break would end the header and start another: header injection.
    if value.contains(['\r', '\n']) {
        return Err(EmailError::InvalidHeader {
            name: name.to_owned(),
            reason: "the value contains a line break".to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
