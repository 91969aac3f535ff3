//! The MIME form of an [`Email`]: the message lettre sends, with the row's Message-ID.

use std::time::SystemTime;

use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{MultiPart, SinglePart};
use lettre::Address;
use sha2::{Digest, Sha256};

use super::{Email, Mailbox};
use crate::message_id::{check_domain, idempotency_header, message_id};
use crate::EmailError;

impl Email {
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
            None => boxes.from.domain.clone(),
        };
        check_domain(&domain).map_err(|reason| EmailError::InvalidDomain {
            domain: domain.clone(),
            reason,
        })?;
        let id = message_id(key, &domain);

        let mut builder = lettre::Message::builder()
            .from(lettre_mailbox("from", boxes.from)?)
            .subject(self.subject.clone())
            .date(date)
            .message_id(Some(id.clone()));
        for mailbox in boxes.to {
            builder = builder.to(lettre_mailbox("to", mailbox)?);
        }
        for mailbox in boxes.cc {
            builder = builder.cc(lettre_mailbox("cc", mailbox)?);
        }
        for mailbox in boxes.bcc {
            builder = builder.bcc(lettre_mailbox("bcc", mailbox)?);
        }
        if let Some(mailbox) = boxes.reply_to {
            builder = builder.reply_to(lettre_mailbox("reply-to", mailbox)?);
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
}

/// lettre's mailbox for an address the payload's checks read: the same parts, so the sink sends
/// to exactly what was checked.
fn lettre_mailbox(
    field: &'static str,
    mailbox: Mailbox,
) -> Result<lettre::message::Mailbox, EmailError> {
    let address = format!("{}@{}", mailbox.user, mailbox.domain);
    let parsed =
        Address::new(mailbox.user, mailbox.domain).map_err(|e| EmailError::InvalidAddress {
            field,
            address,
            reason: e.to_string(),
        })?;
    Ok(lettre::message::Mailbox::new(mailbox.name, parsed))
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
