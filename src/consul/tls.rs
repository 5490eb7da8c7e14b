//! HTTPS to Consul: the CA that signed the agent's certificate, an
//! optional client certificate (for an agent with `verify_incoming`), and
//! an optional server name to verify instead of the address's host, like
//! Consul's own `CONSUL_TLS_SERVER_NAME`.
//!
//! The files are read and checked once, when the configuration is
//! validated, so a missing or wrong file stops the node before it talks
//! to Consul, with the config key and the file named. rustls with the
//! ring provider; the address's scheme decides whether TLS is used.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use thiserror::Error;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::{self, ClientConfig, DigitallySignedStruct, RootCertStore};

/// Where the PEM files are, as configured (`consul.ca_file`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsulTlsFiles {
    /// CA certificate(s) that signed the agent's HTTPS certificate.
    pub ca_file: PathBuf,
    /// Client certificate chain, for an agent with `verify_incoming`.
    pub cert_file: Option<PathBuf>,
    /// Private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name the agent's certificate must carry, instead of the address's
    /// host (`consul.tls_server_name`).
    pub server_name: Option<String>,
}

/// Why the Consul TLS files cannot be used. `key` is the config key that
/// names the file.
#[derive(Debug, Clone, Error)]
#[error("config key {key}: {problem}")]
pub struct ConsulTlsError {
    /// `consul.ca_file`, `consul.cert_file`, `consul.key_file` or
    /// `consul.tls_server_name`.
    pub key: &'static str,
    /// What is wrong (naming the file) and what to do.
    pub problem: String,
}

/// A loaded, checked TLS client setup for Consul. Cheap to clone.
#[derive(Clone)]
pub struct ConsulTls {
    config: Arc<ClientConfig>,
    files: ConsulTlsFiles,
}

impl fmt::Debug for ConsulTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ConsulTls {
    /// Reads and checks the files: the CA must hold at least one usable
    /// certificate, the client certificate and key must belong together.
    pub fn load(files: &ConsulTlsFiles) -> Result<Self, ConsulTlsError> {
        let roots = read_roots("consul.ca_file", &files.ca_file)?;
        let provider = provider();
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| error("consul.ca_file", &files.ca_file, e.to_string()))?;
        let name = match &files.server_name {
            Some(name) => Some(
                ServerName::try_from(name.clone()).map_err(|e| ConsulTlsError {
                    key: "consul.tls_server_name",
                    problem: format!("{name:?} is not a DNS name or IP address ({e})"),
                })?,
            ),
            None => None,
        };
        let verifier: Arc<dyn ServerCertVerifier> = match name {
            Some(name) => Arc::new(NamedVerifier {
                inner: webpki,
                name,
            }),
            None => webpki,
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| error("consul.ca_file", &files.ca_file, e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match (&files.cert_file, &files.key_file) {
            (Some(cert), Some(key)) => {
                let chain = read_chain("consul.cert_file", cert)?;
                let key_der = read_key("consul.key_file", key)?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| {
                        error(
                            "consul.key_file",
                            key,
                            format!("does not fit consul.cert_file {} ({e}): give the private key of its first certificate", cert.display()),
                        )
                    })?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), None) => {
                return Err(ConsulTlsError {
                    key: "consul.key_file",
                    problem: format!("is empty but consul.cert_file is {}: give the client certificate's private key too", cert.display()),
                })
            }
            (None, Some(key)) => {
                return Err(ConsulTlsError {
                    key: "consul.cert_file",
                    problem: format!("is empty but consul.key_file is {}: give the client certificate chain too", key.display()),
                })
            }
        };
        // The Consul client speaks HTTP/1.1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            files: files.clone(),
        })
    }

    /// The rustls client configuration (for reqwest).
    pub fn client_config(&self) -> &ClientConfig {
        &self.config
    }

    /// The files it was loaded from.
    pub fn files(&self) -> &ConsulTlsFiles {
        &self.files
    }
}

/// Verifies the agent's certificate (chain and name) against a configured
/// name instead of the URL's host: for an agent reached by IP, or through
/// a name its certificate does not carry (Consul's `server_name`).
#[derive(Debug)]
struct NamedVerifier {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn error(key: &'static str, path: &Path, problem: impl Into<String>) -> ConsulTlsError {
    ConsulTlsError {
        key,
        problem: format!("cannot use {}: {}", path.display(), problem.into()),
    }
}

fn read_chain(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ConsulTlsError> {
    let pem = std::fs::read(path).map_err(|e| error(key, path, e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(key, path, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(error(
            key,
            path,
            "holds no CERTIFICATE block; give PEM certificates",
        ));
    }
    Ok(certs)
}

fn read_roots(key: &'static str, path: &Path) -> Result<RootCertStore, ConsulTlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_chain(key, path)? {
        roots
            .add(cert)
            .map_err(|e| error(key, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

fn read_key(key: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, ConsulTlsError> {
    let pem = std::fs::read(path).map_err(|e| error(key, path, e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        error(
            key,
            path,
            format!("holds no usable private key ({e}); give a PEM PRIVATE KEY (PKCS#8), RSA PRIVATE KEY or EC PRIVATE KEY block"),
        )
    })
}

/// What a failed HTTPS exchange with Consul means, in words an operator
/// can act on; `None` when the failure is not about TLS. `https` says
/// which scheme the address has.
pub(super) fn explain(e: &reqwest::Error, https: bool, ca: Option<&Path>) -> Option<String> {
    if let Some(r) = rustls_cause(e) {
        return Some(describe(r, ca));
    }
    // Without a rustls error, an https:// address whose server answered
    // something that is not TLS surfaces as a closed or garbled stream.
    if https {
        let text = chain_text(e).to_ascii_lowercase();
        if text.contains("corrupt message") || text.contains("invalidcontenttype") {
            return Some(NOT_TLS.into());
        }
    }
    None
}

pub(super) const NOT_TLS: &str = "the agent does not speak TLS there (it answered in plaintext): use an http:// address, or enable HTTPS on the agent (ports.https)";

fn describe(e: &rustls::Error, ca: Option<&Path>) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let ca = ca.map_or_else(String::new, |p| format!(" {}", p.display()));
    match e {
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "the agent's certificate is not signed by a CA in consul.ca_file{ca} ({e}); give the CA that signed the agent's HTTPS certificate"
        ),
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => format!(
            "the agent's certificate does not carry the name dialled ({e}); set consul.tls_server_name to a name in it, or use an address that matches"
        ),
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            format!("the agent's certificate has expired ({e})")
        }
        E::InvalidCertificate(other) => format!("the agent's certificate is refused: {other:?}"),
        E::AlertReceived(A::CertificateRequired | A::BadCertificate | A::UnknownCA
            | A::HandshakeFailure | A::AccessDenied | A::CertificateUnknown) => format!(
            "the agent refused the TLS handshake ({e}); with verify_incoming it needs a client certificate its CA signed: set consul.cert_file and consul.key_file"
        ),
        E::InvalidMessage(_) => NOT_TLS.into(),
        other => format!("TLS failed: {other}"),
    }
}

/// The rustls error behind `e`, if any. It can sit inside nested
/// `io::Error`s, whose `source()` skips the wrapped error itself, so each
/// is unwrapped by hand.
pub(crate) fn rustls_cause<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(mut err) = cur {
        while let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            err = inner;
        }
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        cur = err.source();
    }
    None
}

fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cur = err.source();
    }
    text
}

/// Go's HTTP server answers this (status 400) to a plaintext request on
/// an HTTPS port, which is what a Consul agent with TLS runs.
pub(super) const PLAINTEXT_TO_HTTPS: &str = "Client sent an HTTP request to an HTTPS server";

/// The whole error chain of a transport failure, for logs.
pub(super) fn transport_text(e: &reqwest::Error) -> String {
    chain_text(e)
}

/// What to add to a transport error over HTTPS when no client certificate
/// is configured and the agent closed the connection under the request:
/// under TLS 1.3 an agent with `verify_incoming` refuses the missing
/// certificate only after the client's handshake is done, and its alert
/// can be lost to the close. The error stays a transport error (retried);
/// only its text says what to suspect.
pub(super) fn closed_without_client_cert_hint(text: &str) -> Option<&'static str> {
    let t = text.to_ascii_lowercase();
    let closed = [
        "not ready",
        "connection reset",
        "connection closed",
        "broken pipe",
        "unexpected eof",
        "canceled",
    ]
    .iter()
    .any(|s| t.contains(s));
    closed.then_some(
        "; the agent closed the TLS connection and no client certificate is configured: an agent with verify_incoming needs one, set consul.cert_file and consul.key_file",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_connection_without_a_client_certificate_names_the_keys_to_set() {
        let hint = closed_without_client_cert_hint(
            "client error (Canceled): operation was canceled: connection was not ready",
        )
        .expect("a hint");
        assert!(hint.contains("consul.cert_file") && hint.contains("consul.key_file"));
        assert!(closed_without_client_cert_hint("connection reset by peer").is_some());
        assert!(closed_without_client_cert_hint("connection refused or unreachable").is_none());
        assert!(closed_without_client_cert_hint("timed out").is_none());
    }
}
