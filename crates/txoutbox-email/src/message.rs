//! The email payload: what a business transaction enqueues, and how the sink turns it into a
//! MIME message with the row's Message-ID.

use std::time::SystemTime;

use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::message_id::{check_domain, idempotency_header, message_id};
use crate::EmailError;

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
    pub fn into_outbox_message(self) -> Result<txoutbox::OutboxMessage, EmailError> {
        self.validate()?;
        txoutbox::OutboxMessage::new(DESTINATION, &self).map_err(EmailError::Outbox)
    }

    /// The domain of the `From` address (the default Message-ID domain).
    pub(crate) fn sender_domain(&self) -> Result<String, EmailError> {
        Ok(parse_mailbox("from", &self.from)?.email.domain().to_owned())
    }

    /// The MIME message for downstream key `key`, with `Message-ID: <{key}@{domain}>`
    /// (`domain` defaults to the From domain), `Idempotency-Key: {key}`, and `Date` = `date`
    /// (the row's enqueue time), so that every attempt sends the same message.
    pub(crate) fn to_message(
        &self,
        key: &str,
        domain: Option<&str>,
        date: SystemTime,
    ) -> Result<(lettre::Message, String), EmailError> {
        let boxes = self.mailboxes()?;
        self.check_content()?;
        if key.is_empty() {
            return Err(EmailError::Build(
                "the delivery has an empty downstream key".to_owned(),
            ));
        }
        let domain = match domain {
            Some(d) => d.to_owned(),
            None => boxes.from.email.domain().to_owned(),
        };
        check_domain(&domain).map_err(|reason| EmailError::InvalidDomain {
            domain: domain.clone(),
            reason,
        })?;
        let id = message_id(key, &domain);

        let mut builder = lettre::Message::builder()
            .from(boxes.from)
            .subject(self.subject.clone())
            .date(date)
            .message_id(Some(id.clone()));
        for mailbox in boxes.to {
            builder = builder.to(mailbox);
        }
        for mailbox in boxes.cc {
            builder = builder.cc(mailbox);
        }
        for mailbox in boxes.bcc {
            builder = builder.bcc(mailbox);
        }
        if let Some(mailbox) = boxes.reply_to {
            builder = builder.reply_to(mailbox);
        }
        builder = builder.raw_header(HeaderValue::new(
            header_name("Idempotency-Key")?,
            idempotency_header(key),
        ));
        for (name, value) in &self.headers {
            builder = builder.raw_header(HeaderValue::new(header_name(name)?, value.clone()));
        }
        let built = match (&self.text, &self.html) {
            (Some(text), Some(html)) => builder.multipart(
                MultiPart::alternative()
                    .boundary(boundary(key))
                    .singlepart(SinglePart::plain(text.clone()))
                    .singlepart(SinglePart::html(html.clone())),
            ),
            (Some(text), None) => builder.singlepart(SinglePart::plain(text.clone())),
            (None, Some(html)) => builder.singlepart(SinglePart::html(html.clone())),
            (None, None) => return Err(EmailError::NoBody),
        };
        let message = built.map_err(|e| EmailError::Build(e.to_string()))?;
        Ok((message, id))
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

fn parse_mailbox(field: &'static str, address: &str) -> Result<Mailbox, EmailError> {
    address
        .trim()
        .parse::<Mailbox>()
        .map_err(|e| EmailError::InvalidAddress {
            field,
            address: address.to_owned(),
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

fn header_name(name: &str) -> Result<HeaderName, EmailError> {
    HeaderName::new_from_ascii(name.to_owned()).map_err(|_| EmailError::InvalidHeader {
        name: name.to_owned(),
        reason: "not a valid header name".to_owned(),
    })
}

/// A multipart boundary fixed by the key, so every attempt sends the same bytes.
fn boundary(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    format!("txoutbox-{}", &hex::encode(digest)[..32])
}

#[cfg(test)]
mod tests;
