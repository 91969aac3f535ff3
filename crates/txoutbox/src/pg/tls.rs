//! TLS to Postgres with rustls: [`SslMode`], the client configuration a mode and its files
//! make (which certificates are checked, by the verifiers of `verify`; the client's identity),
//! and [`MakeTls`], the connector whose handshake failures say in one line what was wrong.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{CertificateError, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::verify::{CaNotInRoots, Roots, ServerCerts};
use crate::error::{Error, Result};

/// libpq's `sslmode`: whether TLS is used, and what of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS when the server offers it, plain text otherwise; the certificate is not checked
    /// (libpq's default).
    #[default]
    Prefer,
    /// TLS or no connection; the certificate is not checked, unless a CA is given
    /// (`sslrootcert`, or `~/.postgresql/root.crt` exists): then it behaves as `verify-ca`, as
    /// libpq does.
    Require,
    /// TLS, and the server's certificate must be signed by the CA of `sslrootcert`; its host
    /// name is not checked.
    VerifyCa,
    /// TLS, the certificate signed by the CA, and issued for the host connected to.
    VerifyFull,
}

impl SslMode {
    pub(super) fn parse(text: &str) -> Result<Self> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's `allow` (plain first, TLS if refused) has no equivalent in tokio-postgres.
            other => {
                return Err(Error::Config(format!(
                "sslmode: {other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            )))
            }
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

display_as_str!(SslMode);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verify {
    None,
    Chain,
    Full,
}

pub(super) fn client_config(
    verify: Verify,
    root: Option<&Path>,
    client_auth: Option<&(PathBuf, PathBuf)>,
) -> Result<rustls::ClientConfig> {
    let provider = crate::sink::crypto_provider();
    let identity = client_auth.map(read_identity).transpose()?;
    let roots = match (verify, root) {
        (Verify::None, _) | (_, None) => None,
        (verify, Some(root)) => {
            let anchors = read_certs(root, "sslrootcert")?;
            let roots = root_store(&anchors, root)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| Error::Config(format!("sslrootcert: {}: {e}", root.display())))?;
            Some(Roots {
                webpki,
                anchors,
                full: verify == Verify::Full,
            })
        }
    };
    let verifier = Arc::new(ServerCerts {
        provider: provider.clone(),
        roots,
    });
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| Error::Config(format!("sslkey: the key does not fit sslcert: {e}"))),
    }
}

fn root_store(certs: &[CertificateDer<'static>], path: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert.clone())
            .map_err(|e| Error::Config(format!("sslrootcert: {}: {e}", path.display())))?;
    }
    Ok(roots)
}

fn read_certs(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>> {
    let unreadable = |e: &dyn fmt::Display| {
        Error::Config(format!("{setting}: cannot read {}: {e}", path.display()))
    };
    std::fs::metadata(path).map_err(|e| unreadable(&e))?;
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| unreadable(&e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| unreadable(&e))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{setting}: {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

fn read_identity(
    (cert, key): &(PathBuf, PathBuf),
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = read_certs(cert, "sslcert")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::Config(format!("sslkey: cannot read {}: {e}", key.display())))?;
    Ok((chain, key))
}

/// The rustls connector of a [`PgConfig`](super::PgConfig) (a `MakeTlsConnect` for tokio-postgres and deadpool),
/// whose handshake failures say in one line what was wrong.
#[derive(Clone)]
pub struct MakeTls {
    inner: MakeRustlsConnect,
    context: Arc<TlsContext>,
}

struct TlsContext {
    mode: SslMode,
    root_cert: Option<PathBuf>,
}

impl MakeTls {
    pub(super) fn new(
        config: rustls::ClientConfig,
        mode: SslMode,
        root_cert: Option<PathBuf>,
    ) -> Self {
        Self {
            inner: MakeRustlsConnect::new(config),
            context: Arc::new(TlsContext { mode, root_cert }),
        }
    }
}

impl fmt::Debug for MakeTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MakeTls")
            .field("sslmode", &self.context.mode)
            .finish_non_exhaustive()
    }
}

impl<S> MakeTlsConnect<S> for MakeTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = TlsConnector<S>;
    type Error = TlsError;

    fn make_tls_connect(&mut self, host: &str) -> std::result::Result<TlsConnector<S>, TlsError> {
        let inner = match MakeTlsConnect::<S>::make_tls_connect(&mut self.inner, host) {
            Ok(inner) => inner,
            Err(never) => match never {},
        };
        Ok(TlsConnector {
            inner,
            host: host.to_owned(),
            context: self.context.clone(),
        })
    }
}

/// One TLS handshake to come (see [`MakeTls`]).
pub struct TlsConnector<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    inner: <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect,
    host: String,
    context: Arc<TlsContext>,
}

impl<S> TlsConnect<S> for TlsConnector<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type Error = TlsError;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<Self::Stream, TlsError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let handshake = self.inner.connect(stream);
        let (host, context) = (self.host, self.context);
        Box::pin(async move {
            handshake
                .await
                .map_err(|e| TlsError(context.describe(&host, e.into())))
        })
    }
}

impl TlsContext {
    fn describe(&self, host: &str, err: Box<dyn std::error::Error + Send + Sync>) -> String {
        let rustls = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        let ca = match &self.root_cert {
            Some(path) => format!("the CA in {} (sslrootcert)", path.display()),
            None => "the CA".to_owned(),
        };
        match rustls {
            Some(rustls::Error::InvalidCertificate(cert)) => match cert {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    format!("TLS: the server's certificate is not signed by {ca}")
                }
                CertificateError::NotValidForName => format!(
                    "TLS: the server's certificate is not issued for {host:?} \
                     (sslmode={} checks the host name)",
                    self.mode
                ),
                CertificateError::NotValidForNameContext { presented, .. } => format!(
                    "TLS: the server's certificate is not issued for {host:?} but for {} \
                     (sslmode={} checks the host name)",
                    presented
                        .iter()
                        .map(|name| bare_name(name))
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.mode
                ),
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "TLS: the server's certificate has expired".to_owned()
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "TLS: the server's certificate is not valid yet".to_owned()
                }
                CertificateError::Other(other) if other.0.is::<CaNotInRoots>() => format!(
                    "TLS: the server's certificate is a CA certificate (CA:TRUE) that is not \
                     itself in {ca}: put the server's own certificate in sslrootcert (a \
                     self-signed one is trusted as it is), or give the server a certificate \
                     without CA:TRUE"
                ),
                other => format!("TLS: the server's certificate is refused: {other}"),
            },
            Some(other) => format!("TLS: the handshake with {host} failed: {other}"),
            None => format!("TLS: the handshake with {host} failed: {err}"),
        }
    }
}

/// `db.example` of webpki's `DnsName("db.example")`, `10.0.0.1` of `IpAddress(10.0.0.1)`.
pub(super) fn bare_name(presented: &str) -> &str {
    let inner = presented
        .strip_prefix("DnsName(")
        .or_else(|| presented.strip_prefix("IpAddress("))
        .and_then(|rest| rest.strip_suffix(')'));
    match inner {
        Some(inner) => inner.trim_matches('"'),
        None => presented,
    }
}

/// A TLS failure, in one line (the source of the `tokio_postgres::Error` a connection fails with).
#[derive(Debug)]
pub struct TlsError(pub(super) String);

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}
