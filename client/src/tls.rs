//! TLS to idgen nodes (rustls with the ring provider): the CA that signed
//! the nodes' certificates, an optional client certificate for nodes that
//! require one (mTLS), and an optional server name for nodes that are
//! known by IP address while their certificates name a host.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

use crate::Error;

/// How the client speaks TLS to the nodes. Every node is dialled over TLS
/// once this is set on [`ClientBuilder::tls`](crate::ClientBuilder::tls);
/// a node that answers in plaintext fails the handshake and is set aside.
#[derive(Clone)]
pub struct TlsConfig {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    server_name: Option<String>,
}

impl fmt::Debug for TlsConfig {
    /// Shows whether a client certificate is set, never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsConfig {
    /// Trust the nodes whose certificates were signed by the CA
    /// certificate(s) in `ca_pem` (PEM).
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            identity: None,
            server_name: None,
        }
    }

    /// [`TlsConfig::new`] with the CA read from a PEM file.
    pub fn from_ca_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        Ok(Self::new(read("CA", path.as_ref())?))
    }

    /// Present this client certificate chain and private key (PEM) to
    /// nodes that ask for one (the node's `server.tls.client_ca`).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// [`TlsConfig::identity`] with both read from PEM files.
    pub fn identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, Error> {
        let cert = read("client certificate", cert.as_ref())?;
        let key = read("client key", key.as_ref())?;
        Ok(self.identity(cert, key))
    }

    /// Check every node's certificate against this name instead of the
    /// host of its address (discovery gives IP addresses; a certificate
    /// that names `idgen.internal` needs `server_name("idgen.internal")`).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Parses the PEM and builds the rustls configuration (ALPN h2).
    pub(crate) fn build(&self) -> Result<Connector, Error> {
        let bad = |what: &str, e: &dyn fmt::Display| Error::Config(format!("TLS {what}: {e}"));
        let mut roots = RootCertStore::empty();
        let ca = certs(&self.ca_pem).map_err(|e| bad("CA", &e))?;
        for cert in ca {
            roots
                .add(cert)
                .map_err(|e| bad("CA", &format!("not a usable CA certificate: {e}")))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => {
                let chain = certs(cert).map_err(|e| bad("client certificate", &e))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| bad("client key", &format!("no usable private key: {e}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("client certificate and key", &certificate_problem(&e)))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let server_name = match &self.server_name {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|e| bad("server name", &format!("{name:?}: {e}")))?,
            ),
            None => None,
        };
        Ok(Connector {
            config: Arc::new(config),
            server_name,
            identity: self.identity.is_some(),
        })
    }
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path)
        .map_err(|e| Error::Config(format!("TLS {what} {}: cannot read: {e}", path.display())))
}

/// The certificates of PEM text (nodes' and the Consul agent's CAs, client
/// chains); an error when it holds none.
pub(crate) fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM CERTIFICATE block".into());
    }
    Ok(certs)
}

/// A parsed [`TlsConfig`]: dials nodes over TLS.
#[derive(Clone)]
pub(crate) struct Connector {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
    /// Whether a client certificate is presented.
    identity: bool,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl Connector {
    /// How this client speaks TLS, for the words of a failed call.
    pub(crate) fn tls_use(&self) -> TlsUse {
        TlsUse::Tls {
            identity: self.identity,
        }
    }

    /// A lazy channel to `addr` (`host:port`) over TLS; the handshake runs
    /// at the first call, bounded by the endpoint's connect timeout.
    pub(crate) fn channel(&self, addr: &str, endpoint: Endpoint) -> Result<Channel, String> {
        let (host, port) = split(addr)?;
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => ServerName::try_from(host.clone()).map_err(|e| {
                format!("node address {addr:?}: {host:?} is not a TLS server name: {e}")
            })?,
        };
        let config = Arc::clone(&self.config);
        let connect = tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let (config, name, host) = (Arc::clone(&config), name.clone(), host.clone());
            async move {
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                let _ = tcp.set_nodelay(true);
                let tls = TlsConnector::from(config).connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        });
        Ok(endpoint.connect_with_connector_lazy(connect))
    }
}

/// What to do about an X.509 v1 certificate (`openssl x509 -req` without
/// `-extfile`): rustls takes v3 only.
const V1_CERTIFICATE: &str = "the certificate is X.509 v1; re-issue it as v3 (openssl: add -extfile with basicConstraints/subjectAltName, or use idgen tls dev-certs)";

/// A client certificate and key rustls refused, naming the cause: v1, a
/// key that is not the certificate's, or rustls' own words.
fn certificate_problem(e: &rustls::Error) -> String {
    // webpki's UnsupportedCertVersion reaches rustls as
    // CertificateError::Other, seen only in its Debug text.
    if format!("{e:?}").contains("UnsupportedCertVersion") {
        return V1_CERTIFICATE.to_owned();
    }
    match e {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            "the private key is not the key of the (first) certificate".to_owned()
        }
        other => other.to_string(),
    }
}

/// Whether the client speaks TLS to the nodes, and presents a client
/// certificate: what the words of a failed connection depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsUse {
    /// No [`ClientBuilder::tls`](crate::ClientBuilder::tls).
    Plaintext,
    /// TLS, with or without [`TlsConfig::identity`].
    Tls {
        /// A client certificate is set.
        identity: bool,
    },
}

/// What went wrong with a connection, in words that say what to do, from
/// its innermost `cause` and how the client speaks TLS. Never tells a
/// client that has TLS set to set it.
pub(crate) fn failure_words(cause: &str, tls: TlsUse) -> &'static str {
    let lower = cause.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    let identity = matches!(tls, TlsUse::Tls { identity: true });
    if has(&["unsupportedcertversion"]) {
        return "TLS: the node's certificate is X.509 v1; re-issue it as v3 (openssl: add -extfile with basicConstraints/subjectAltName, or use idgen tls dev-certs)";
    }
    if has(&["certificaterequired"]) {
        return if identity {
            "TLS: the node requires a client certificate and did not take this one: check TlsConfig::identity"
        } else {
            "TLS: the node requires a client certificate: set ClientBuilder::tls(TlsConfig::from_ca_file(ca)?.identity_files(cert, key)?)"
        };
    }
    if identity
        && has(&[
            "badcertificate",
            "unknownca",
            "certificateunknown",
            "unsupportedcertificate",
            "certificateexpired",
            "certificaterevoked",
            "accessdenied",
        ])
    {
        return "TLS: the node refused the client certificate: it must be signed by the node's server.tls.client_ca, unexpired, X.509 v3 with clientAuth usage";
    }
    if has(&["invalidcertificate", "certificate"]) {
        return "TLS: the node's certificate is not trusted: check the CA and the server name of TlsConfig";
    }
    if has(&["corrupt message", "invalidcontenttype"]) {
        return "TLS: the node does not speak TLS; it serves plaintext: drop ClientBuilder::tls";
    }
    // A TLS 1.3 node refuses a missing client certificate after the
    // client's side of the handshake is done: the call then sees the
    // alert, or, when its request raced it, only the connection closing.
    let broke = has(&["frame with invalid size", "reset", "broken pipe"]);
    // hyper's words for a connection that closed under a call in flight.
    let closed = has(&["connection closed", "operation was canceled"]);
    match tls {
        TlsUse::Plaintext if broke => {
            return "the connection broke; the node may speak TLS: set ClientBuilder::tls"
        }
        TlsUse::Tls { identity: false } if broke || closed => {
            return "the connection closed during or right after the TLS handshake: if the node requires a client certificate (server.tls.client_required), set TlsConfig::identity"
        }
        TlsUse::Tls { identity: true } if broke || closed => {
            return "the connection closed during or right after the TLS handshake (the node may have refused the client certificate)"
        }
        _ => {}
    }
    if has(&["refused"]) {
        return "connection refused: nothing listens there (is idgen serving at this address? A node that is shutting down or restarting refuses connections too)";
    }
    if has(&["timed out", "timeout", "elapsed"]) {
        return "timed out connecting: the node or its network does not answer";
    }
    "the connection failed"
}

/// `host:port` (IPv6 hosts in brackets) into host and port.
fn split(addr: &str) -> Result<(String, u16), String> {
    let bad = || format!("bad node address {addr:?}: expected host:port");
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port = port.parse().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(split("127.0.0.1:80").unwrap(), ("127.0.0.1".into(), 80));
        assert_eq!(split("[::1]:50051").unwrap(), ("::1".into(), 50051));
        assert_eq!(split("node-1:7").unwrap(), ("node-1".into(), 7));
        assert!(split("node-1").is_err());
        assert!(split(":80").is_err());
        assert!(split("a:b").is_err());
    }

    #[test]
    fn a_ca_that_is_not_pem_is_refused_with_what_to_fix() {
        let err = TlsConfig::new("not a certificate").build().unwrap_err();
        assert!(err.to_string().contains("TLS CA"), "{err}");
        assert!(err.to_string().contains("no PEM CERTIFICATE"), "{err}");
    }

    #[test]
    fn only_a_plaintext_client_is_told_to_set_tls() {
        let plain = TlsUse::Plaintext;
        let bare = TlsUse::Tls { identity: false };
        let with_cert = TlsUse::Tls { identity: true };
        for cause in [
            "connection reset by peer",
            "broken pipe",
            "frame with invalid size",
        ] {
            assert!(failure_words(cause, plain).contains("set ClientBuilder::tls"));
            for tls in [bare, with_cert] {
                let w = failure_words(cause, tls);
                assert!(!w.contains("ClientBuilder::tls"), "{cause}: {w}");
            }
            assert!(failure_words(cause, bare).contains("TlsConfig::identity"));
        }
        let canceled = failure_words("operation was canceled", bare);
        assert!(canceled.contains("TlsConfig::identity"), "{canceled}");
        let closed = failure_words("connection closed", bare);
        assert!(
            closed.contains("client certificate") && closed.contains("TlsConfig::identity"),
            "{closed}"
        );
        assert_eq!(
            failure_words("connection closed", plain),
            "the connection failed"
        );
        let required = "received fatal alert: CertificateRequired";
        let w = failure_words(required, bare);
        assert!(
            w.contains("requires a client certificate") && w.contains("identity_files"),
            "{w}"
        );
        assert!(!failure_words(required, with_cert).contains("ClientBuilder::tls"));
        let refused = "received fatal alert: UnknownCA";
        assert!(failure_words(refused, with_cert).contains("refused the client certificate"));
        let untrusted = "invalid peer certificate: UnknownIssuer";
        assert!(failure_words(untrusted, bare).contains("not trusted"));
    }

    #[test]
    fn a_v1_or_mismatched_client_certificate_is_named() {
        let v1 = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tls-v1/v1.pem"
        ))
        .unwrap();
        let key = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tls-v1/v1-key.pem"
        ))
        .unwrap();
        let ca = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tls-v1/ca.pem"
        ))
        .unwrap();
        let err = TlsConfig::new(ca)
            .identity(v1, key)
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("X.509 v1; re-issue it as v3"), "{err}");
        assert!(!err.contains("UnsupportedCertVersion"), "{err}");
    }

    #[test]
    fn the_debug_form_never_shows_the_key() {
        let c = TlsConfig::new("ca").identity("cert", "SECRET KEY");
        assert!(!format!("{c:?}").contains("SECRET"));
    }
}
