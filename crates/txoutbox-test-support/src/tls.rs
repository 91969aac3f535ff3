//! Certificates for TLS tests: a CA of the test's own and server certificates it signs, for a
//! [`Cluster`] started with [`ClusterOptions::tls`](crate::ClusterOptions), and
//! [`TlsServer`], such a cluster with its CA's file ready for `sslrootcert`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::{Cluster, ClusterOptions, ConnInfo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority made for one test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A certificate (a server's or a client's) and its private key, PEM-encoded.
#[derive(Debug, Clone)]
pub struct ServerCert {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<TestCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)
            .context("self-signing the test CA")?;
        Ok(TestCa { issuer })
    }

    /// The CA's certificate (what a client's `sslrootcert` points to).
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes the CA's certificate to `dir/name` and returns the path.
    pub fn write_cert(&self, dir: &Path, name: &str) -> Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, self.cert_pem())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// A client certificate for the role `user` (its common name), and its key.
    pub fn client_cert(&self, user: &str) -> Result<ServerCert> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        self.sign(params, "the client certificate")
    }

    /// A server certificate for `names` (DNS names, or IP addresses such as `127.0.0.1`).
    pub fn server_cert(&self, names: &[&str]) -> Result<ServerCert> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone())?;
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        self.sign(params, "the server certificate")
    }

    /// A new key and the certificate of `params` for it, signed by this CA (`what` names it in
    /// the error).
    fn sign(&self, params: CertificateParams, what: &str) -> Result<ServerCert> {
        let key = KeyPair::generate()?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("signing {what}"))?;
        Ok(ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A self-signed certificate for `name`, made as the PostgreSQL documentation makes one
/// (`openssl req -new -x509 -nodes -subj /CN=name`): the name in its common name only (no
/// subjectAltName), `CA:TRUE`, and its own issuer, so that a client's `sslrootcert` is the
/// certificate itself. `expired` makes one whose validity ended in 2001.
pub fn self_signed_cert(name: &str, expired: bool) -> Result<ServerCert> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    if expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let key = KeyPair::generate()?;
    let cert = params
        .self_signed(&key)
        .context("self-signing the server certificate")?;
    Ok(ServerCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A private cluster serving TLS (plain connections still accepted) with a certificate signed by
/// a CA of its own, and a directory for the client's files (the CA's certificate among them).
#[derive(Debug)]
pub struct TlsServer {
    /// The running cluster.
    pub cluster: Cluster,
    /// The CA that signed the server's certificate.
    pub ca: TestCa,
    files: TempDir,
    ca_file: PathBuf,
}

impl TlsServer {
    /// Starts a cluster whose certificate is issued for `names` (DNS names or IP addresses).
    pub fn start(names: &[&str]) -> Result<TlsServer> {
        Self::start_with(names, false)
    }

    /// As [`TlsServer::start`], and every TCP connection must present a client certificate
    /// signed by the same CA (see [`TestCa::client_cert`]).
    pub fn start_requiring_client_certs(names: &[&str]) -> Result<TlsServer> {
        Self::start_with(names, true)
    }

    /// Starts a cluster serving `cert`, a certificate of [`self_signed_cert`]: its own CA, so
    /// [`TlsServer::ca_file`] is the certificate itself (the test CA signs no certificate of
    /// the server's).
    pub fn start_self_signed(cert: ServerCert) -> Result<TlsServer> {
        let ca = TestCa::new("txoutbox test CA")?;
        let cert_pem = cert.cert_pem.clone();
        let cluster = Cluster::private(&ClusterOptions {
            tls: Some(cert),
            ..ClusterOptions::default()
        })?;
        let files = tempfile::tempdir()?;
        let ca_file = files.path().join("server.pem");
        std::fs::write(&ca_file, cert_pem)
            .with_context(|| format!("writing {}", ca_file.display()))?;
        Ok(TlsServer {
            cluster,
            ca,
            files,
            ca_file,
        })
    }

    fn start_with(names: &[&str], client_certs: bool) -> Result<TlsServer> {
        let ca = TestCa::new("txoutbox test CA")?;
        let cluster = Cluster::private(&ClusterOptions {
            tls: Some(ca.server_cert(names)?),
            client_ca: client_certs.then(|| ca.cert_pem()),
            ..ClusterOptions::default()
        })?;
        let files = tempfile::tempdir()?;
        let ca_file = ca.write_cert(files.path(), "ca.pem")?;
        Ok(TlsServer {
            cluster,
            ca,
            files,
            ca_file,
        })
    }

    /// The file of the CA's certificate (what `sslrootcert` names): the server's own for
    /// [`TlsServer::start_self_signed`].
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// A file `name` with `contents` in the client's directory (another CA, a broken file).
    pub fn write_file(&self, name: &str, contents: &str) -> Result<PathBuf> {
        let path = self.files.path().join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// The superuser's connection, reached as `localhost`, without TLS settings (prefer).
    pub fn admin(&self) -> ConnInfo {
        self.cluster.admin().with_host("localhost")
    }

    /// The superuser's connection as `localhost`, `sslmode=verify-full` against the CA.
    pub fn verified(&self) -> ConnInfo {
        self.admin()
            .with_tls("sslmode", "verify-full")
            .with_tls("sslrootcert", &self.ca_file.display().to_string())
    }
}
