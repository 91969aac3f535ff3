//! Which Host a dashboard without users answers. A page of another site whose name it rebinds
//! to 127.0.0.1 (DNS rebinding) reaches a loopback dashboard from a visitor's browser as its own
//! origin: the Origin and Sec-Fetch-Site checks pass. Only the Host it sends still names that
//! site, so without sign-in a request is answered only when its Host is a loopback name or
//! address, or one the configuration allows.

use std::net::{Ipv4Addr, Ipv6Addr};

use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

/// The authority a request is addressed to: its `Host` header, else (HTTP/2) its URI's.
pub(crate) fn of_request(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    match headers.get(header::HOST) {
        Some(host) => host.to_str().ok().map(str::to_owned),
        None => uri.authority().map(|a| a.as_str().to_owned()),
    }
}

/// `host` split into its name and port (`[::1]:80` → `[::1]`, `80`); `None` when it is not a
/// `name[:port]` or `[ipv6][:port]`.
fn split(host: &str) -> Option<(&str, Option<&str>)> {
    let (name, port) = if host.starts_with('[') {
        let end = host.find(']')? + 1;
        let rest = &host[end..];
        let port = match rest.strip_prefix(':') {
            Some(port) => Some(port),
            None if rest.is_empty() => None,
            None => return None,
        };
        (&host[..end], port)
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    (!name.is_empty() && port_ok).then_some((name, port))
}

/// True when `name` (without its port) is `localhost`, a 127.0.0.0/8 address or `[::1]`.
fn is_loopback(name: &str) -> bool {
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback());
    }
    name.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// True when a dashboard without users answers a request addressed to `host`: a loopback name
/// or address with any port, or one of `allowed` (a name for any port, `name:port` for that
/// one), compared without case.
pub(crate) fn is_answered(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host else {
        return false;
    };
    let Some((name, _)) = split(host) else {
        return false;
    };
    is_loopback(name)
        || allowed
            .iter()
            .map(|a| a.trim())
            .any(|a| a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(name))
}

/// The answer to a request addressed to another host: 421 with a problem document (RFC 9457)
/// saying why and how to serve the dashboard under that name.
pub(crate) fn misdirected(host: Option<&str>) -> Response {
    let named = match host {
        Some(h) => format!(
            "this request is addressed to {:?}",
            h.chars().take(100).collect::<String>()
        ),
        None => "this request names no host".to_owned(),
    };
    let problem = serde_json::json!({
        "type": "about:blank",
        "title": "Misdirected Request",
        "status": 421,
        "detail": format!(
            "{named}, but this dashboard has no users, so it answers only requests addressed to \
             localhost, 127.0.0.1 or [::1]: a page of another site could otherwise reach it \
             through DNS rebinding and act as an operator. To serve it under another name, \
             configure users (--user NAME:PASSWORD:ROLE, or DashboardConfig::users), or allow \
             the name (--allowed-host NAME, or DashboardConfig::allowed_hosts) behind your own \
             access control."
        ),
    });
    (
        StatusCode::MISDIRECTED_REQUEST,
        [(header::CONTENT_TYPE, "application/problem+json")],
        problem.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_are_answered_with_or_without_a_port() {
        for host in [
            "localhost",
            "LocalHost:9470",
            "127.0.0.1",
            "127.0.0.1:9470",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:9470",
            "[0:0:0:0:0:0:0:1]:1",
        ] {
            assert!(is_answered(Some(host), &[]), "{host}");
        }
    }

    #[test]
    fn other_hosts_are_not_answered() {
        for host in [
            "rebind.attacker.example:19470",
            "rebind.attacker.example",
            "localhost.attacker.example",
            "127.0.0.1.attacker.example",
            "localhost.",
            "0.0.0.0:9470",
            "10.0.0.1",
            "[::ffff:127.0.0.1]",
            "[::1",
            "::1",
            "[::1]x",
            "localhost:",
            "localhost:http",
            "localhost:123456",
            "",
        ] {
            assert!(!is_answered(Some(host), &[]), "{host}");
        }
        assert!(!is_answered(None, &[]));
    }

    #[test]
    fn allowed_hosts_are_answered_by_name_or_by_name_and_port() {
        let allowed = vec!["ops.example".to_owned(), "admin.example:8443".to_owned()];
        assert!(is_answered(Some("OPS.example:443"), &allowed));
        assert!(is_answered(Some("ops.example"), &allowed));
        assert!(is_answered(Some("admin.example:8443"), &allowed));
        assert!(!is_answered(Some("admin.example:443"), &allowed));
        assert!(!is_answered(Some("evil.example"), &allowed));
    }
}
