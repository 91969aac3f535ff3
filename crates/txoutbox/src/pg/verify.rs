//! Which server certificates a connection accepts, as libpq does ([`ServerCerts`]): any
//! (`prefer`, and `require` without a CA), or those of the CAs in `sslrootcert` ([`Roots`]:
//! `verify-ca`, and with the host name `verify-full`), a certificate listed there itself
//! included. That last case is the self-signed certificate the PostgreSQL documentation makes
//! (`openssl req -x509`), which is `CA:TRUE`: webpki refuses a CA's certificate as a server's,
//! OpenSSL trusts it as the anchor it is. The handshake's signatures are checked in every case.

use std::net::IpAddr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};
use x509_cert::der::oid::db::rfc4519::CN;
use x509_cert::der::Decode;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{BasicConstraints, SubjectAltName};
use x509_cert::Certificate;

type Verified = std::result::Result<ServerCertVerified, rustls::Error>;
type Signature = std::result::Result<HandshakeSignatureValid, rustls::Error>;

/// The one verifier of every mode: the server's certificate is accepted as it is (`prefer`, and
/// `require` without a CA: `roots` unset) or checked by [`Roots`]; the handshake's signatures are
/// checked in every case, with the provider's algorithms, so the channel is encrypted to the
/// holder of the certificate's key.
#[derive(Debug)]
pub(super) struct ServerCerts {
    pub(super) provider: Arc<CryptoProvider>,
    pub(super) roots: Option<Roots>,
}

/// `verify-ca` (`full` unset) and `verify-full`: a certificate that is one of `sslrootcert`'s
/// (`anchors`) is trusted as it is, if valid now and, for `verify-full`, issued for the host
/// (libpq's rules: [`CertNames`]); any other is checked by webpki against the same roots.
#[derive(Debug)]
pub(super) struct Roots {
    pub(super) webpki: Arc<WebPkiServerVerifier>,
    pub(super) anchors: Vec<CertificateDer<'static>>,
    pub(super) full: bool,
}

impl ServerCertVerifier for ServerCerts {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Verified {
        let Some(roots) = &self.roots else {
            return Ok(ServerCertVerified::assertion());
        };
        if roots
            .anchors
            .iter()
            .any(|a| a.as_ref() == end_entity.as_ref())
        {
            return anchor(end_entity, server_name, now, roots.full);
        }
        match roots
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            // webpki checks the chain (and validity dates) before the name: a name error means
            // the chain is good.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !roots.full => Ok(ServerCertVerified::assertion()),
            // webpki's refusal of a CA's certificate as a server's, said as such.
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(_)))
                if is_ca(end_entity) =>
            {
                Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                    OtherError(Arc::new(CaNotInRoots)),
                )))
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Signature {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Signature {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A server certificate with `CA:TRUE` that is not one of `sslrootcert`'s (the one-line text of
/// a failed handshake names it).
#[derive(Debug)]
pub(super) struct CaNotInRoots;

impl std::fmt::Display for CaNotInRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server's certificate is a CA's (CA:TRUE) and not in sslrootcert")
    }
}

impl std::error::Error for CaNotInRoots {}

/// Whether `cert` says `CA:TRUE` (false when it cannot be read).
fn is_ca(cert: &CertificateDer<'_>) -> bool {
    Certificate::from_der(cert.as_ref())
        .ok()
        .and_then(|c| c.tbs_certificate.get::<BasicConstraints>().ok().flatten())
        .is_some_and(|(_, constraints)| constraints.ca)
}

/// A server certificate that is one of `sslrootcert`'s: the trust anchor is the certificate
/// itself, whatever its basic constraints. Checked: its validity period, and for `verify-full`
/// the host name.
fn anchor(
    cert: &CertificateDer<'_>,
    server_name: &ServerName<'_>,
    now: UnixTime,
    full: bool,
) -> Verified {
    let refused = |e: CertificateError| Err(rustls::Error::InvalidCertificate(e));
    let Ok(cert) = Certificate::from_der(cert.as_ref()) else {
        return refused(CertificateError::BadEncoding);
    };
    let validity = &cert.tbs_certificate.validity;
    let not_before = UnixTime::since_unix_epoch(validity.not_before.to_unix_duration());
    let not_after = UnixTime::since_unix_epoch(validity.not_after.to_unix_duration());
    if now.as_secs() < not_before.as_secs() {
        return refused(CertificateError::NotValidYetContext {
            time: now,
            not_before,
        });
    }
    if now.as_secs() > not_after.as_secs() {
        return refused(CertificateError::ExpiredContext {
            time: now,
            not_after,
        });
    }
    if !full {
        return Ok(ServerCertVerified::assertion());
    }
    let Some(names) = CertNames::of(&cert) else {
        return refused(CertificateError::BadEncoding);
    };
    if names.match_host(server_name) {
        Ok(ServerCertVerified::assertion())
    } else {
        refused(CertificateError::NotValidForNameContext {
            expected: server_name.to_owned(),
            presented: names.presented(server_name),
        })
    }
}

/// The names a certificate is issued for, as libpq reads them: its subjectAltName's DNS names
/// and IP addresses, and the first common name of its subject.
#[derive(Debug, Default)]
pub(super) struct CertNames {
    pub(super) dns: Vec<Vec<u8>>,
    pub(super) ips: Vec<Vec<u8>>,
    pub(super) common_name: Option<Vec<u8>>,
}

impl CertNames {
    /// The names of `cert`; `None` for a subjectAltName that cannot be read.
    fn of(cert: &Certificate) -> Option<CertNames> {
        let mut names = CertNames::default();
        let alt_names = cert.tbs_certificate.get::<SubjectAltName>().ok()?;
        for name in alt_names.map(|(_, san)| san.0).unwrap_or_default() {
            match name {
                GeneralName::DnsName(dns) => names.dns.push(dns.as_bytes().to_vec()),
                GeneralName::IpAddress(ip) => names.ips.push(ip.as_bytes().to_vec()),
                _ => {}
            }
        }
        names.common_name = cert
            .tbs_certificate
            .subject
            .0
            .iter()
            .flat_map(|rdn| rdn.0.iter())
            .find(|atv| atv.oid == CN)
            .map(|atv| atv.value.value().to_vec());
        Some(names)
    }

    /// Whether the certificate is issued for `host`, as libpq decides: a DNS name equal to the
    /// host or matching it as a wildcard ([`wildcard_matches`]), or an IP address equal to it;
    /// the common name only when the certificate has no name of the host's kind (DNS name for a
    /// host name, IP address for an address).
    pub(super) fn match_host(&self, host: &ServerName<'_>) -> bool {
        let (text, ip) = host_parts(host);
        let named = |name: &[u8]| {
            name.eq_ignore_ascii_case(text.as_bytes()) || wildcard_matches(name, &text)
        };
        if self.dns.iter().any(|name| named(name)) {
            return true;
        }
        let octets = ip.map(|ip| match ip {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        });
        if octets.as_ref().is_some_and(|o| self.ips.contains(o)) {
            return true;
        }
        let same_kind = if ip.is_some() { &self.ips } else { &self.dns };
        same_kind.is_empty() && self.common_name.as_deref().is_some_and(named)
    }

    /// The names to show when `host` matched none: those of the SAN, and the common name if it
    /// was looked at.
    fn presented(&self, host: &ServerName<'_>) -> Vec<String> {
        let mut shown: Vec<String> = self
            .dns
            .iter()
            .map(|name| String::from_utf8_lossy(name).into_owned())
            .collect();
        shown.extend(self.ips.iter().filter_map(|octets| ip_text(octets)));
        let same_kind = if host_parts(host).1.is_some() {
            &self.ips
        } else {
            &self.dns
        };
        if same_kind.is_empty() {
            shown.extend(
                self.common_name
                    .as_deref()
                    .map(|cn| String::from_utf8_lossy(cn).into_owned()),
            );
        }
        shown
    }
}

/// The host as text, and as an address when it is one.
fn host_parts(host: &ServerName<'_>) -> (String, Option<IpAddr>) {
    match host {
        ServerName::IpAddress(ip) => {
            let ip = IpAddr::from(*ip);
            (ip.to_string(), Some(ip))
        }
        ServerName::DnsName(name) => (name.as_ref().to_owned(), None),
        other => (format!("{other:?}"), None),
    }
}

/// An IP address of a certificate as text (`None` for a length that is neither v4 nor v6).
fn ip_text(octets: &[u8]) -> Option<String> {
    if let Ok(v4) = <[u8; 4]>::try_from(octets) {
        return Some(IpAddr::from(v4).to_string());
    }
    <[u8; 16]>::try_from(octets)
        .ok()
        .map(|v6| IpAddr::from(v6).to_string())
}

/// libpq's wildcard rule: `pattern` is `*.` and a suffix; `host` is one label (at least one
/// character, no dot) followed by that suffix; case-insensitive.
pub(super) fn wildcard_matches(pattern: &[u8], host: &str) -> bool {
    let host = host.as_bytes();
    let Some(suffix) = pattern.strip_prefix(b"*") else {
        return false;
    };
    if pattern.len() < 3 || !suffix.starts_with(b".") || suffix.len() >= host.len() {
        return false;
    }
    let (label, rest) = host.split_at(host.len() - suffix.len());
    rest.eq_ignore_ascii_case(suffix) && !label.contains(&b'.')
}
