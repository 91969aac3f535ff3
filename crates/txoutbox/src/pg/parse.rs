//! The connection string, read as libpq reads it: a `postgres://` URL or a `key=value` list,
//! the TLS settings taken out (tokio-postgres refuses them), and the `PG*` environment
//! variables for what the string leaves out.

use tokio_postgres::Config;

use crate::error::{Error, Result};

/// The TLS parameters a connection string may hold, before defaults.
#[derive(Default)]
pub(super) struct TlsParams {
    pub(super) mode: Option<String>,
    pub(super) root_cert: Option<String>,
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
}

impl TlsParams {
    /// Takes `key` when it is a TLS parameter; `Ok(false)` when it is not one.
    pub(super) fn take(&mut self, key: &str, value: String) -> Result<bool> {
        let slot = match key {
            "sslmode" => &mut self.mode,
            "sslrootcert" => &mut self.root_cert,
            "sslcert" => &mut self.cert,
            "sslkey" => &mut self.key,
            // On by default in libpq, and what rustls does for host names anyway.
            "sslsni" => return Ok(true),
            "sslpassword"
            | "sslcrl"
            | "sslcrldir"
            | "sslcompression"
            | "sslcertmode"
            | "ssl_min_protocol_version"
            | "ssl_max_protocol_version"
            | "requiressl"
            | "sslkeylogfile" => {
                return Err(Error::Config(format!(
                    "{key}: not supported (TLS settings: sslmode, sslrootcert, sslcert, sslkey)"
                )))
            }
            _ => return Ok(false),
        };
        *slot = Some(value);
        Ok(true)
    }
}

/// Takes the TLS parameters out of a connection string, returning the rest for tokio-postgres.
/// A URL of another scheme (`postgress://`, `mysql://`) is refused by its scheme, not read as a
/// malformed key=value list (whose error would quote the string, password and all).
pub(super) fn strip_tls_params(text: &str, tls: &mut TlsParams) -> Result<String> {
    match url_scheme(text) {
        Some(scheme) if scheme == "postgres" || scheme == "postgresql" => {
            return strip_from_url(text, tls)
        }
        Some(scheme) => {
            return Err(Error::Config(format!(
                "connection string: unknown scheme `{scheme}` (expected postgres:// or \
                 postgresql://, or key=value pairs)"
            )))
        }
        None => {}
    }
    let mut kept = Vec::new();
    for (key, value) in key_values(text)? {
        if !tls.take(&key, value.clone())? {
            kept.push(format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            ));
        }
    }
    Ok(kept.join(" "))
}

/// The scheme of a URL (`scheme://...`, RFC 3986's letters, digits, `+`, `-`, `.`), or `None`
/// for text that does not start like one (a key=value list).
fn url_scheme(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

fn strip_from_url(url: &str, tls: &mut TlsParams) -> Result<String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !tls.take(&percent_decode(key)?, percent_decode(value)?)? {
            kept.push(pair);
        }
    }
    Ok(if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    })
}

fn percent_decode(text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    Error::Config(format!("connection string: bad percent-escape in {text:?}"))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::Config(format!("connection string: {text:?} is not UTF-8")))
}

/// libpq's key=value syntax: `key = value`, values bare or single-quoted, `\` escaping.
fn key_values(text: &str) -> Result<Vec<(String, String)>> {
    let bad = |why: &str| Error::Config(format!("connection string: {why}"));
    let mut chars = text.chars().peekable();
    let mut pairs = Vec::new();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(bad(&format!("expected = after {key:?}")));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(bad(&format!("unterminated quoted value of {key:?}"))),
                    Some('\'') => break,
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => return Err(bad(&format!("unterminated quoted value of {key:?}"))),
                    },
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(escaped) = chars.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// libpq's environment variables, for what the connection string leaves out.
pub(super) fn apply_env(
    config: &mut Config,
    tls: &mut TlsParams,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<()> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    if config.get_hosts().is_empty() {
        if let Some(hosts) = var("PGHOST") {
            for host in hosts.split(',') {
                config.host(host.trim());
            }
        }
    }
    if config.get_ports().is_empty() {
        if let Some(ports) = var("PGPORT") {
            for port in ports.split(',') {
                let port = port
                    .trim()
                    .parse()
                    .map_err(|_| Error::Config(format!("PGPORT: {port:?} is not a port")))?;
                config.port(port);
            }
        }
    }
    if config.get_user().is_none() {
        if let Some(user) = var("PGUSER") {
            config.user(user);
        }
    }
    if config.get_password().is_none() {
        if let Some(password) = var("PGPASSWORD") {
            config.password(password);
        }
    }
    if config.get_dbname().is_none() {
        if let Some(dbname) = var("PGDATABASE") {
            config.dbname(dbname);
        }
    }
    if config.get_application_name().is_none() {
        if let Some(name) = var("PGAPPNAME") {
            config.application_name(name);
        }
    }
    for (slot, name) in [
        (&mut tls.mode, "PGSSLMODE"),
        (&mut tls.root_cert, "PGSSLROOTCERT"),
        (&mut tls.cert, "PGSSLCERT"),
        (&mut tls.key, "PGSSLKEY"),
    ] {
        if slot.is_none() {
            *slot = var(name);
        }
    }
    Ok(())
}
