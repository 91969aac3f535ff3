//! Certificates for TLS tests: a CA of the test's own and server certificates it signs, for a
//! [`Cluster`](crate::Cluster) started with [`ClusterOptions::tls`](crate::ClusterOptions).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
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

/// A server certificate and its private key, PEM-encoded.
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

    /// A server certificate for `names` (DNS names, or IP addresses such as `127.0.0.1`).
    pub fn server_cert(&self, names: &[&str]) -> Result<ServerCert> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone())?;
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        let key = KeyPair::generate()?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("signing the server certificate")?;
        Ok(ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
