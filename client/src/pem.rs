//! The one reader of TLS files (PEM): certificate chains, CA bundles and
//! private keys, for every user in the workspace — this crate (nodes'
//! CA, client certificates, the Consul agent's CA), the `idgen` command
//! (`--ca`, `--cert`, `--key`) and the node (`server.tls.*`,
//! `consul.ca_file`, ...). Each caller names the file its own way (a
//! config key, a flag); the problem is said here, once, with what to do.
//! Also the one reading of why rustls refused a certificate and key
//! ([`certificate_problem`]).

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a TLS file cannot be used. The file is named by the caller.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The file cannot be read.
    #[error("cannot read: {0}")]
    Read(#[from] std::io::Error),
    /// The file is not PEM text.
    #[error("not valid PEM: {0}")]
    NotPem(rustls_pki_types::pem::Error),
    /// The file holds no certificate.
    #[error("holds no PEM CERTIFICATE block; give the certificate(s) in PEM, a chain leaf first")]
    NoCertificate,
    /// The file holds no private key rustls can use.
    #[error("holds no usable private key ({0}); give a PEM PRIVATE KEY (PKCS#8), RSA PRIVATE KEY or EC PRIVATE KEY block")]
    NoPrivateKey(rustls_pki_types::pem::Error),
    /// A certificate that cannot serve as a trust anchor.
    #[error("not a usable CA certificate: {0}")]
    NotACa(rustls::Error),
}

/// The certificates of PEM text (a chain leaf first, or a CA bundle); an
/// error when it holds none.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(PemError::NotPem)?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// The first private key of PEM text (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(PemError::NoPrivateKey)
}

/// The trust anchors of a CA bundle in PEM text: every certificate must
/// be usable as one.
pub fn ca_roots(pem: &[u8]) -> Result<RootCertStore, PemError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(pem)? {
        roots.add(cert).map_err(PemError::NotACa)?;
    }
    Ok(roots)
}

/// [`certificates`] of the file at `path`.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    certificates(&std::fs::read(path)?)
}

/// [`private_key`] of the file at `path`.
pub fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    private_key(&std::fs::read(path)?)
}

/// [`ca_roots`] of the file at `path`.
pub fn read_ca_roots(path: &Path) -> Result<RootCertStore, PemError> {
    ca_roots(&std::fs::read(path)?)
}

/// What to do about an X.509 v1 certificate (`openssl x509 -req` without
/// `-extfile` makes one): rustls takes v3 only.
pub const V1_CERTIFICATE: &str = "the certificate is X.509 v1; re-issue it as v3 (openssl: add -extfile with basicConstraints/subjectAltName, or use idgen tls dev-certs)";

/// A certificate and key rustls refused, in words that name the cause: an
/// X.509 v1 certificate ([`V1_CERTIFICATE`]), a key that is not the
/// certificate's, a key whose public half cannot be derived, or rustls'
/// own words.
pub fn certificate_problem(e: &rustls::Error) -> String {
    use rustls::InconsistentKeys as K;
    // webpki's UnsupportedCertVersion reaches rustls as
    // CertificateError::Other, seen only in its Debug text.
    if format!("{e:?}").contains("UnsupportedCertVersion") {
        return V1_CERTIFICATE.to_owned();
    }
    match e {
        rustls::Error::InconsistentKeys(K::KeyMismatch) => {
            "the private key is not the key of the (first) certificate".to_owned()
        }
        rustls::Error::InconsistentKeys(K::Unknown) => {
            "the private key's public half cannot be derived to check it against the certificate: use a PKCS#8, PKCS#1 or SEC1 key".to_owned()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_a_certificate_or_key_says_what_to_give() {
        let none = certificates(b"not a certificate").unwrap_err().to_string();
        assert!(none.contains("no PEM CERTIFICATE block"), "{none}");
        let key = private_key(b"not a key").unwrap_err().to_string();
        assert!(key.contains("PRIVATE KEY (PKCS#8)"), "{key}");
        let missing = read_certificates(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(matches!(missing, PemError::Read(_)), "{missing}");
    }

    #[test]
    fn a_v1_certificate_is_named_as_such() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tls-v1/");
        let chain = read_certificates(Path::new(&format!("{dir}v1.pem"))).unwrap();
        let key = read_private_key(Path::new(&format!("{dir}v1-key.pem"))).unwrap();
        let provider = rustls::crypto::ring::default_provider();
        let e = rustls::sign::CertifiedKey::from_der(chain, key, &provider).unwrap_err();
        assert_eq!(certificate_problem(&e), V1_CERTIFICATE);
    }
}
