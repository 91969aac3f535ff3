//! The name the SMTP sink gives in `EHLO`. RFC 5321 (4.1.4, 2.3.5) asks for the client's fully
//! qualified primary host name or, failing one, an address literal; a bare host name such as a
//! container's `3f2a9c` is neither, and some servers refuse or score it as spam.
//!
//! A configured name is checked here. The default is the host name if it has a dot, else the
//! fully qualified name `/etc/hosts` gives it (as `hostname -f` finds it through files), else the
//! literal of the local address that routes to the SMTP server.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use lettre::transport::smtp::extension::ClientId;

/// The hosts file the default name is looked up in.
const HOSTS: &str = "/etc/hosts";

/// Reads a configured EHLO name: a domain with a dot (`mail.example.com`), an address literal
/// (`[192.0.2.1]`, `[IPv6:2001:db8::1]`) or a bare IP address, which is sent as a literal.
pub(crate) fn parse(name: &str) -> Result<ClientId, String> {
    if name.is_empty() {
        return Err("it is empty".to_owned());
    }
    if let Some(c) = name.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("it contains {c:?} (a space or control character)"));
    }
    if let Some(inner) = name.strip_prefix('[') {
        let ip = inner.strip_suffix(']').and_then(|body| {
            match body
                .get(..5)
                .filter(|tag| tag.eq_ignore_ascii_case("IPv6:"))
            {
                Some(_) => body[5..].parse::<Ipv6Addr>().ok().map(IpAddr::V6),
                None => body.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
            }
        });
        return ip
            .map(literal)
            .ok_or_else(|| "an address literal is [192.0.2.1] or [IPv6:2001:db8::1]".to_owned());
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(literal(ip));
    }
    check_fqdn(name)?;
    Ok(ClientId::Domain(name.to_owned()))
}

/// A fully qualified domain as RFC 5321 writes one: dot-separated labels of letters, digits and
/// inner hyphens, at least two of them, ASCII (punycode for the others).
fn check_fqdn(name: &str) -> Result<(), String> {
    if !name.is_ascii() {
        return Err("it is not ASCII (give the punycode form, xn--...)".to_owned());
    }
    if name.len() > 253 {
        return Err("it is longer than 253 characters".to_owned());
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("it has an empty label (a leading, trailing or double dot)".to_owned());
        }
        if label.len() > 63 {
            return Err(format!("the label {label:?} is longer than 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(format!(
                "the label {label:?} holds a character other than letters, digits and '-'"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("the label {label:?} starts or ends with '-'"));
        }
    }
    if !name.contains('.') {
        return Err(
            "it is not fully qualified (no dot): give the host's full name or an address \
             literal such as [192.0.2.1]"
                .to_owned(),
        );
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|top| top.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("it looks like an IPv4 address but is not one".to_owned());
    }
    Ok(())
}

/// The default EHLO name when the host has a fully qualified one: its host name if that has a
/// dot, else the name `/etc/hosts` gives it. `None` leaves the address literal.
pub(crate) fn host_fqdn() -> Option<String> {
    let host = hostname::get().ok()?.into_string().ok()?;
    if check_fqdn(&host).is_ok() {
        return Some(host);
    }
    let hosts = std::fs::read_to_string(HOSTS).ok()?;
    fqdn_in_hosts(&hosts, &host)
}

/// The first name with a dot on a line of `hosts` (the hosts file's text) that lists `short`.
pub(crate) fn fqdn_in_hosts(hosts: &str, short: &str) -> Option<String> {
    hosts.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        fields.next()?; // the address
        let names: Vec<&str> = fields.collect();
        if !names.iter().any(|name| name.eq_ignore_ascii_case(short)) {
            return None;
        }
        names
            .into_iter()
            .find(|name| check_fqdn(name).is_ok())
            .map(str::to_owned)
    })
}

/// The address literal of the local address this host uses to reach `host:port`. A UDP socket
/// connected to the server makes the kernel choose the route and source address; no packet is
/// sent.
pub(crate) async fn route_literal(host: &str, port: u16) -> io::Result<ClientId> {
    let mut last = None;
    for server in tokio::net::lookup_host((host, port)).await? {
        match local_address_towards(server) {
            Ok(ip) => return Ok(literal(ip)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "it has no address")))
}

fn local_address_towards(server: SocketAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any)?;
    socket.connect(server)?;
    Ok(socket.local_addr()?.ip())
}

/// `[192.0.2.1]` or `[IPv6:2001:db8::1]`; an IPv4-mapped IPv6 address is written as IPv4.
fn literal(ip: IpAddr) -> ClientId {
    match ip {
        IpAddr::V4(v4) => ClientId::Ipv4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => ClientId::Ipv4(v4),
            None => ClientId::Ipv6(v6),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBIAN: &str = "\
127.0.0.1\tlocalhost
127.0.1.1\tweb1.example.com\tweb1

# The following lines are desirable for IPv6 capable hosts
::1     localhost ip6-localhost ip6-loopback
ff02::1 ip6-allnodes
";

    #[test]
    fn the_hosts_file_gives_the_first_dotted_name_of_the_line_listing_the_short_name() {
        assert_eq!(
            fqdn_in_hosts(DEBIAN, "web1").as_deref(),
            Some("web1.example.com")
        );
        assert_eq!(
            fqdn_in_hosts(DEBIAN, "WEB1").as_deref(),
            Some("web1.example.com"),
            "host names compare without case"
        );
        // The short name first, aliases after it, as Kubernetes and hand-written files have it.
        let k8s = "10.1.2.3\tpod-7 pod-7.api.default.svc.cluster.local pod-7.api\n";
        assert_eq!(
            fqdn_in_hosts(k8s, "pod-7").as_deref(),
            Some("pod-7.api.default.svc.cluster.local")
        );
    }

    #[test]
    fn a_short_name_without_a_dotted_name_beside_it_has_no_fqdn() {
        // Docker's file: the container id alone.
        let docker = "127.0.0.1\tlocalhost\n172.17.0.2\t3f2a9c\n";
        assert_eq!(fqdn_in_hosts(docker, "3f2a9c"), None);
        assert_eq!(fqdn_in_hosts(DEBIAN, "db1"), None, "not listed");
        assert_eq!(fqdn_in_hosts("", "web1"), None);
    }

    #[test]
    fn comments_and_odd_lines_of_the_hosts_file_are_skipped() {
        let text = "\
# 10.0.0.1 web1.wrong.example web1
web1
10.0.0.2 web1 # web1.comment.example
   \t
10.0.0.3 web1 bad_name.example web1.example.org
";
        assert_eq!(
            fqdn_in_hosts(text, "web1").as_deref(),
            Some("web1.example.org"),
            "a commented line, a line of one field, a name in a comment and an invalid name \
             do not count"
        );
    }

    #[test]
    fn configured_domains_and_address_literals_are_taken() {
        let domain = |s: &str| ClientId::Domain(s.to_owned());
        assert_eq!(parse("mail.example.com"), Ok(domain("mail.example.com")));
        assert_eq!(
            parse("xn--bcher-kva.example"),
            Ok(domain("xn--bcher-kva.example"))
        );
        assert_eq!(
            parse("[192.0.2.1]"),
            Ok(ClientId::Ipv4(Ipv4Addr::new(192, 0, 2, 1)))
        );
        assert_eq!(
            parse("[IPv6:2001:db8::1]"),
            Ok(ClientId::Ipv6("2001:db8::1".parse().expect("v6")))
        );
        assert_eq!(
            parse("192.0.2.7"),
            Ok(ClientId::Ipv4(Ipv4Addr::new(192, 0, 2, 7))),
            "a bare address is sent as a literal"
        );
        assert_eq!(
            parse("2001:db8::7").map(|id| id.to_string()),
            Ok("[IPv6:2001:db8::7]".to_owned())
        );
    }

    #[test]
    fn configured_names_that_are_not_domains_or_literals_are_refused() {
        for bad in [
            "",
            "mail example.com",
            "mail.example.com\r\nMAIL FROM:<x@y>",
            "mail.example.com\t",
            "localhost",
            "3f2a9c",
            "mail.example.com.",
            ".example.com",
            "a..example.com",
            "-mail.example.com",
            "mail_1.example.com",
            "bücher.example",
            "1.2.3",
            "[192.0.2.1",
            "[300.0.2.1]",
            "[2001:db8::1]",
            "[IPv6:192.0.2.1]",
        ] {
            let reason = parse(bad).expect_err(bad);
            assert!(
                !reason.is_empty() && !reason.contains('\n'),
                "{bad:?}: {reason}"
            );
        }
        let long = format!("{}.example.com", "a".repeat(64));
        assert!(parse(&long).is_err());
    }

    #[tokio::test]
    async fn the_route_literal_is_the_local_address_towards_the_server() {
        let id = route_literal("127.0.0.1", 25)
            .await
            .expect("loopback route");
        assert_eq!(id, ClientId::Ipv4(Ipv4Addr::LOCALHOST));
        assert_eq!(id.to_string(), "[127.0.0.1]");
    }
}
