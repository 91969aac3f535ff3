//! Connections to Postgres, with TLS as libpq does it: one parser for the connection string
//! (URL or key=value form, and the `PG*` environment variables) that keeps the TLS settings
//! tokio-postgres does not know (`sslrootcert`, `sslcert`, `sslkey`, `verify-ca`, `verify-full`),
//! and one rustls connector that honours them. Every connection the library, the relay and the
//! binaries open goes through [`PgConfig`].

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{Error, Result};

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
    fn parse(text: &str) -> Result<Self> {
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

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stream of a connection opened through [`PgConfig`] (TLS or plain, as negotiated).
pub type PgStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// A connection to drive (spawn it), as [`tokio_postgres::connect`] returns.
pub type PgConnection = Connection<Socket, PgStream>;

/// Where and how to connect: a `tokio_postgres::Config` and the TLS settings of libpq.
///
/// ```no_run
/// # async fn demo() -> Result<(), txoutbox::Error> {
/// let pg = txoutbox::PgConfig::parse(
///     "postgres://app@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
/// )?;
/// let (client, connection) = pg.connect().await?;
/// tokio::spawn(connection);
/// let relay = txoutbox::Relay::builder(pg.clone()); // any API taking a config takes it
/// # let _ = (client, relay); Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgConfig {
    config: Config,
    mode: SslMode,
    root_cert: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    tls: MakeTls,
}

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("config", &self.config)
            .field("sslmode", &self.mode)
            .field("sslrootcert", &self.root_cert)
            .finish_non_exhaustive()
    }
}

/// The TLS parameters a connection string may hold, before defaults.
#[derive(Default)]
struct TlsParams {
    mode: Option<String>,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl TlsParams {
    /// Takes `key` when it is a TLS parameter; `Ok(false)` when it is not one.
    fn take(&mut self, key: &str, value: String) -> Result<bool> {
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

impl PgConfig {
    /// Parses a connection string as libpq does: a `postgres://` (or `postgresql://`) URL or a
    /// `key=value` list, with the `PG*` environment variables (`PGHOST`, `PGPORT`, `PGUSER`,
    /// `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`) for
    /// what the string leaves out. Certificates and keys are read here, so a missing or
    /// unreadable file is an [`Error::Config`] naming the setting, before any connection.
    pub fn parse(text: &str) -> Result<PgConfig> {
        Self::parse_with_env(text, |name| std::env::var(name).ok())
    }

    /// [`PgConfig::parse`] with the environment given by `env` (a variable's value by name).
    pub fn parse_with_env(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<PgConfig> {
        let mut tls = TlsParams::default();
        let rest = strip_tls_params(text.trim(), &mut tls)?;
        let mut config: Config = rest
            .parse()
            .map_err(|e| Error::Config(format!("connection string: {}", with_causes(&e))))?;
        apply_env(&mut config, &mut tls, &env)?;
        let mode = match &tls.mode {
            Some(mode) => SslMode::parse(mode)?,
            None => SslMode::default(),
        };
        // libpq's default files, in ~/.postgresql.
        let home = env("HOME").map(|h| Path::new(&h).join(".postgresql"));
        let default = |file: &str| home.as_ref().map(|dir| dir.join(file));
        let root_cert = match tls.root_cert.as_deref() {
            Some("system") => {
                return Err(Error::Config(
                    "sslrootcert: \"system\" is not supported; give the CA's PEM file".into(),
                ))
            }
            Some(path) => Some(PathBuf::from(path)),
            None => default("root.crt").filter(|p| p.is_file()),
        };
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
            return Err(Error::Config(format!(
                "sslrootcert: sslmode={mode} checks the server's certificate against a CA: \
                 set sslrootcert to the CA's PEM file (there is no ~/.postgresql/root.crt)"
            )));
        }
        let cert = match tls.cert {
            Some(path) => Some(PathBuf::from(path)),
            None => default("postgresql.crt").filter(|p| p.is_file()),
        };
        let key = match tls.key {
            Some(path) => Some(PathBuf::from(path)),
            None => default("postgresql.key").filter(|p| p.is_file() && cert.is_some()),
        };
        // Without a CA, `require` and `prefer` encrypt without checking (libpq's behaviour).
        let verify = match (mode, &root_cert) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => Verify::None,
            (SslMode::Require, Some(_)) | (SslMode::VerifyCa, _) => Verify::Chain,
            (SslMode::VerifyFull, _) => Verify::Full,
        };
        let client_auth = match (cert, key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            (Some(_), None) => {
                return Err(Error::Config(
                    "sslkey: sslcert is set, but not the key of the certificate".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(Error::Config(
                    "sslcert: sslkey is set, but not the certificate".into(),
                ))
            }
        };
        let root = match verify {
            Verify::None => None,
            _ => root_cert.as_deref(),
        };
        let tls_config = client_config(verify, root, client_auth.as_ref())?;
        // libpq checks the certificate of a `hostaddr` given without `host` against the
        // address; tokio-postgres names the server for TLS by `host` only.
        if config.get_hosts().is_empty() {
            for addr in config.get_hostaddrs().to_vec() {
                config.host(addr.to_string());
            }
        }
        // Postgres has no TLS over Unix sockets, and libpq ignores sslmode there.
        let unix_only = !config.get_hosts().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_)));
        config.ssl_mode(match mode {
            _ if unix_only => tokio_postgres::config::SslMode::Disable,
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        Ok(PgConfig {
            config,
            mode,
            tls: MakeTls::new(tls_config, mode, root.map(Path::to_path_buf)),
            root_cert,
            client_cert: client_auth,
        })
    }

    /// The tokio-postgres configuration (host, user, options...); its TLS settings are this
    /// config's.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The tokio-postgres configuration, to change a setting (`options`, `dbname`...).
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// The `sslmode` in effect.
    pub fn ssl_mode(&self) -> SslMode {
        self.mode
    }

    /// The CA file the server's certificate is checked against, if any.
    pub fn root_cert(&self) -> Option<&Path> {
        self.root_cert.as_deref()
    }

    /// The client certificate and its key (`sslcert`, `sslkey`) presented to the server, if any.
    pub fn client_cert(&self) -> Option<(&Path, &Path)> {
        self.client_cert
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()))
    }

    /// The TLS connector, for `tokio_postgres::Config::connect` and pools of one's own.
    pub fn tls(&self) -> MakeTls {
        self.tls.clone()
    }

    /// Opens a connection; drive the returned [`PgConnection`] on a task of its own. A TLS
    /// failure is [`Error::StoreUnavailable`] with one line saying what was wrong.
    pub async fn connect(&self) -> Result<(Client, PgConnection)> {
        Ok(self.config.connect(self.tls()).await?)
    }

    /// A deadpool manager over this configuration, with TLS.
    pub fn manager(&self, config: deadpool_postgres::ManagerConfig) -> deadpool_postgres::Manager {
        deadpool_postgres::Manager::from_config(self.config.clone(), self.tls(), config)
    }
}

impl std::str::FromStr for PgConfig {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        PgConfig::parse(text)
    }
}

/// A `tokio_postgres::Config` has no place for certificates: its `sslmode` (disable, prefer,
/// require) is used as is, without checking the server's certificate. Parse the connection
/// string with [`PgConfig::parse`] to check it (`verify-ca`, `verify-full`).
impl From<Config> for PgConfig {
    fn from(config: Config) -> Self {
        let mode = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        // Without files to read, building the rustls config cannot fail (ring has TLS 1.2 and 1.3).
        let tls = client_config(Verify::None, None, None).expect("a TLS config without files");
        let tls = MakeTls::new(tls, mode, None);
        PgConfig {
            config,
            mode,
            root_cert: None,
            client_cert: None,
            tls,
        }
    }
}

impl From<&Config> for PgConfig {
    fn from(config: &Config) -> Self {
        config.clone().into()
    }
}

impl From<&PgConfig> for PgConfig {
    fn from(config: &PgConfig) -> Self {
        config.clone()
    }
}

/// The crypto provider of every Postgres TLS connection (the workspace's, ring), chosen here
/// once rather than taken from the process default.
fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    None,
    Chain,
    Full,
}

fn client_config(
    verify: Verify,
    root: Option<&Path>,
    client_auth: Option<&(PathBuf, PathBuf)>,
) -> Result<rustls::ClientConfig> {
    let provider = provider();
    let identity = client_auth.map(read_identity).transpose()?;
    let verifier: Arc<dyn ServerCertVerifier> = match (verify, root) {
        (Verify::None, _) | (_, None) => Arc::new(AcceptAny(provider.clone())),
        (verify, Some(root)) => {
            let roots = read_roots(root)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| Error::Config(format!("sslrootcert: {}: {e}", root.display())))?;
            if verify == Verify::Full {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
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

fn read_roots(path: &Path) -> Result<RootCertStore> {
    let certs = read_certs(path, "sslrootcert")?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
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

/// Takes the TLS parameters out of a connection string, returning the rest for tokio-postgres.
fn strip_tls_params(text: &str, tls: &mut TlsParams) -> Result<String> {
    for scheme in ["postgres://", "postgresql://"] {
        if text.starts_with(scheme) {
            return strip_from_url(text, tls);
        }
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
fn apply_env(
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

/// Accepts any certificate (`prefer`, and `require` without a CA): the handshake's signatures are
/// still checked, so the channel is encrypted to the holder of the certificate's key.
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to the CA; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain (and validity dates) before the name: a name error means
        // the chain is good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The rustls connector of a [`PgConfig`] (a `MakeTlsConnect` for tokio-postgres and deadpool),
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
    fn new(config: rustls::ClientConfig, mode: SslMode, root_cert: Option<PathBuf>) -> Self {
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
                other => format!("TLS: the server's certificate is refused: {other}"),
            },
            Some(other) => format!("TLS: the handshake with {host} failed: {other}"),
            None => format!("TLS: the handshake with {host} failed: {err}"),
        }
    }
}

/// `db.example` of webpki's `DnsName("db.example")`, `10.0.0.1` of `IpAddress(10.0.0.1)`.
fn bare_name(presented: &str) -> &str {
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
pub struct TlsError(String);

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

/// One line for a connection failure without a server answer: what tokio-postgres says and its
/// causes (its own text stops at "error connecting to server"); a TLS failure says what was wrong,
/// without "error performing TLS handshake" in front.
pub(crate) fn describe(err: &tokio_postgres::Error) -> String {
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(tls) = cause.downcast_ref::<TlsError>() {
            return tls.0.clone();
        }
        if cause.to_string() == "server does not support TLS" {
            return "TLS: the server does not accept TLS connections, and the sslmode \
                    (require, verify-ca or verify-full) refuses to connect without it"
                .to_owned();
        }
        source = cause.source();
    }
    with_causes(err)
}

/// `err: its cause: the cause's cause`, in one line (tokio-postgres's own text leaves causes out).
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !cause_text.is_empty() && !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use tokio_postgres::config::Host;

    use super::*;

    fn parse(text: &str) -> Result<PgConfig> {
        PgConfig::parse_with_env(text, |_| None)
    }

    /// The message of the `Error::Config` that parsing `text` fails with.
    fn config_error(text: &str) -> String {
        match parse(text) {
            Err(Error::Config(message)) => message,
            other => panic!("{text}: expected Error::Config, got {other:?}"),
        }
    }

    #[test]
    fn url_keeps_tls_parameters_tokio_postgres_refuses() -> Result<()> {
        let pg =
            parse("postgres://app:pw@db.example:6543/shop?sslmode=require&application_name=x")?;
        assert_eq!(pg.ssl_mode(), SslMode::Require);
        assert_eq!(pg.config().get_dbname(), Some("shop"));
        assert_eq!(pg.config().get_application_name(), Some("x"));
        assert_eq!(
            pg.config().get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        Ok(())
    }

    #[test]
    fn key_value_form_with_quotes_survives_stripping() -> Result<()> {
        let pg =
            parse(r"host=localhost user=app password='it\'s x' sslmode = disable dbname=a\ b")?;
        assert_eq!(pg.ssl_mode(), SslMode::Disable);
        assert_eq!(pg.config().get_password(), Some(&b"it's x"[..]));
        assert_eq!(pg.config().get_dbname(), Some("a b"));
        Ok(())
    }

    #[test]
    fn default_is_prefer_like_libpq() -> Result<()> {
        let pg = parse("host=localhost")?;
        assert_eq!(pg.ssl_mode(), SslMode::Prefer);
        assert_eq!(
            pg.config().get_ssl_mode(),
            tokio_postgres::config::SslMode::Prefer
        );
        Ok(())
    }

    #[test]
    fn unknown_sslmode_is_a_config_error_naming_sslmode() {
        let message = config_error("host=x sslmode=allow");
        assert!(
            message.starts_with("sslmode: \"allow\" is not one of"),
            "{message}"
        );
        let message = config_error("postgres://x/db?sslmode=verify_full");
        assert!(message.starts_with("sslmode: \"verify_full\""), "{message}");
    }

    #[test]
    fn verify_full_without_a_ca_is_a_config_error_naming_sslrootcert() {
        for text in [
            "host=localhost sslmode=verify-full",
            "postgres://localhost/db?sslmode=verify-ca",
        ] {
            let message = config_error(text);
            assert!(
                message.starts_with("sslrootcert: sslmode=verify-"),
                "{message}"
            );
        }
    }

    #[test]
    fn sslcert_without_sslkey_and_the_reverse_are_config_errors() {
        let message = config_error("host=x sslcert=/etc/client.pem");
        assert!(message.starts_with("sslkey: sslcert is set"), "{message}");
        let message = config_error("host=x sslkey=/etc/client.key");
        assert!(message.starts_with("sslcert: sslkey is set"), "{message}");
    }

    #[test]
    fn missing_files_are_config_errors_naming_the_setting_and_the_path() {
        let message = config_error(
            "postgres://localhost/db?sslmode=verify-ca&sslrootcert=%2Fnowhere%2Fca.pem",
        );
        assert!(
            message.starts_with("sslrootcert: cannot read /nowhere/ca.pem"),
            "{message}"
        );
        let message = config_error("host=x sslcert=/nowhere/c.pem sslkey=/nowhere/c.key");
        assert!(
            message.starts_with("sslcert: cannot read /nowhere/c.pem"),
            "{message}"
        );
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_a_config_error() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n")?;
        let message = config_error(&format!(
            "host=x sslmode=verify-full sslrootcert='{}'",
            path.display()
        ));
        assert_eq!(
            message,
            format!("sslrootcert: {} holds no PEM certificate", path.display())
        );
        Ok(())
    }

    #[test]
    fn unsupported_tls_settings_are_refused_by_name() {
        for (text, setting) in [
            ("host=x sslcrl=/x", "sslcrl"),
            ("host=x sslpassword=p", "sslpassword"),
            (
                "postgres://x/db?ssl_min_protocol_version=TLSv1.3",
                "ssl_min_protocol_version",
            ),
        ] {
            let message = config_error(text);
            assert!(
                message.starts_with(&format!("{setting}: not supported")),
                "{message}"
            );
        }
        let message = config_error("host=x sslmode=verify-full sslrootcert=system");
        assert!(message.starts_with("sslrootcert: \"system\""), "{message}");
    }

    #[test]
    fn malformed_strings_are_config_errors() {
        assert!(config_error("host=x user='open").contains("unterminated"));
        assert!(config_error("host x").contains("expected ="));
        assert!(config_error("postgres://x/db?sslrootcert=%zz").contains("percent-escape"));
        assert_eq!(
            config_error("postgres://x/db?bogus=1"),
            "connection string: invalid connection string: unknown option `bogus`"
        );
    }

    #[test]
    fn environment_fills_what_the_string_leaves_out() -> Result<()> {
        let pg = PgConfig::parse_with_env("dbname=x", |name| match name {
            "PGHOST" => Some("db1".into()),
            "PGUSER" => Some("u".into()),
            "PGSSLMODE" => Some("require".into()),
            "PGDATABASE" => Some("ignored".into()),
            _ => None,
        })?;
        assert_eq!(pg.ssl_mode(), SslMode::Require);
        assert_eq!(pg.config().get_user(), Some("u"));
        assert_eq!(pg.config().get_dbname(), Some("x"));
        assert!(matches!(pg.config().get_hosts(), [Host::Tcp(h)] if h == "db1"));
        Ok(())
    }

    #[test]
    fn the_string_wins_over_the_environment() -> Result<()> {
        let pg = PgConfig::parse_with_env("host=a sslmode=disable", |name| match name {
            "PGSSLMODE" => Some("verify-full".into()),
            "PGHOST" => Some("b".into()),
            _ => None,
        })?;
        assert_eq!(pg.ssl_mode(), SslMode::Disable);
        assert!(matches!(pg.config().get_hosts(), [Host::Tcp(h)] if h == "a"));
        Ok(())
    }

    #[test]
    fn an_unknown_sslmode_in_the_environment_names_sslmode() {
        let err = PgConfig::parse_with_env("host=x", |name| {
            (name == "PGSSLMODE").then(|| "on".to_owned())
        });
        assert!(
            matches!(&err, Err(Error::Config(m)) if m.starts_with("sslmode: \"on\"")),
            "{err:?}"
        );
    }

    #[test]
    fn a_hostaddr_without_host_names_the_server_for_tls() -> Result<()> {
        let pg = parse("hostaddr=127.0.0.1 sslmode=require")?;
        assert!(matches!(pg.config().get_hosts(), [Host::Tcp(h)] if h == "127.0.0.1"));
        Ok(())
    }

    #[test]
    fn unix_sockets_ignore_sslmode_as_libpq_does() -> Result<()> {
        let pg = parse("host=/var/run/postgresql sslmode=require")?;
        assert_eq!(pg.ssl_mode(), SslMode::Require);
        assert_eq!(
            pg.config().get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
        Ok(())
    }

    #[test]
    fn sslnegotiation_is_passed_to_tokio_postgres() -> Result<()> {
        let pg = parse("host=x sslmode=require sslnegotiation=direct")?;
        assert_eq!(
            pg.config().get_ssl_negotiation(),
            tokio_postgres::config::SslNegotiation::Direct
        );
        Ok(())
    }

    #[test]
    fn a_tokio_postgres_config_keeps_its_sslmode() {
        let mut config = Config::new();
        config
            .host("x")
            .ssl_mode(tokio_postgres::config::SslMode::Require);
        assert_eq!(PgConfig::from(config).ssl_mode(), SslMode::Require);
        assert_eq!(PgConfig::from(Config::new()).ssl_mode(), SslMode::Prefer);
    }

    #[test]
    fn presented_names_are_shown_bare() {
        assert_eq!(bare_name("DnsName(\"db.example\")"), "db.example");
        assert_eq!(bare_name("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(bare_name("something else"), "something else");
    }
}
