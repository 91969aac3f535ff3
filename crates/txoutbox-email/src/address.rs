//! Mailbox addresses (`ada@example.org`, `Ada Lovelace <ada@example.org>`), read exactly as the
//! sink's lettre reads them, without lettre: a payload checked when it is built is one the sink
//! accepts, and one it refuses is refused before the row is written.
//!
//! The grammar (`grammar.rs`) is lettre 0.11's RFC 2822 mailbox parser (nom, MIT OR
//! Apache-2.0); the local part and the domain are then checked as lettre's `Address::new` does:
//! `email_address`'s rules, a bracketed or bare IP address as a domain, and a non-ASCII domain
//! by its IDNA (punycode) form.

use std::net::IpAddr;

use email_address::EmailAddress;

mod grammar;

/// One address, read: the display name, if any, and the two sides of `@`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mailbox {
    pub(crate) name: Option<String>,
    pub(crate) user: String,
    pub(crate) domain: String,
}

/// Why an address does not parse; the texts are lettre's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressError {
    /// Not a mailbox at all (`not an address`, `<a@b`).
    NotAMailbox,
    /// The part before `@` is not a local part.
    User,
    /// The part after `@` is not a domain or an IP address.
    Domain,
}

impl std::fmt::Display for AddressError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddressError::NotAMailbox => "Invalid input",
            AddressError::User => "Invalid email user",
            AddressError::Domain => "Invalid email domain",
        })
    }
}

/// Reads `text` as one mailbox, surrounding white space allowed.
pub(crate) fn parse(text: &str) -> Result<Mailbox, AddressError> {
    let (_, (name, (user, domain))) =
        grammar::mailbox(text).map_err(|_| AddressError::NotAMailbox)?;
    if !EmailAddress::is_valid_local_part(&user) {
        return Err(AddressError::User);
    }
    check_domain(&domain)?;
    Ok(Mailbox { name, user, domain })
}

fn check_domain(domain: &str) -> Result<(), AddressError> {
    check_domain_ascii(domain).or_else(|_| {
        let ascii = idna::domain_to_ascii(domain).map_err(|_| AddressError::Domain)?;
        check_domain_ascii(&ascii)
    })
}

fn check_domain_ascii(domain: &str) -> Result<(), AddressError> {
    if EmailAddress::is_valid_domain(domain) {
        return Ok(());
    }
    let ip = domain
        .strip_prefix('[')
        .and_then(|ip| ip.strip_suffix(']'))
        .unwrap_or(domain);
    match ip.parse::<IpAddr>() {
        Ok(_) => Ok(()),
        Err(_) => Err(AddressError::Domain),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_display_name_and_an_address_are_read_apart() {
        let parsed = parse(" Ada Lovelace <ada@example.org> ").expect("parses");
        assert_eq!(parsed.name.as_deref(), Some("Ada Lovelace"));
        assert_eq!(
            (parsed.user.as_str(), parsed.domain.as_str()),
            ("ada", "example.org")
        );
        let bare = parse("ada@example.org").expect("parses");
        assert_eq!(bare.name, None);
        let quoted = parse("\"Lovelace, Ada\" <ada@example.org>").expect("parses");
        assert_eq!(quoted.name.as_deref(), Some("Lovelace, Ada"));
    }

    #[test]
    fn what_is_not_a_mailbox_says_which_part_is_wrong() {
        assert_eq!(parse("not an address"), Err(AddressError::NotAMailbox));
        assert_eq!(parse("<ada@example.org"), Err(AddressError::NotAMailbox));
        assert_eq!(parse("ada@-example.org"), Err(AddressError::Domain));
    }
}
