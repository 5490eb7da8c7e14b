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
                    .map_err(|e| bad("client certificate and key", &e))?
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
        })
    }
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path)
        .map_err(|e| Error::Config(format!("TLS {what} {}: cannot read: {e}", path.display())))
}

fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read certificates: {e}"))?;
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
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl Connector {
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
    fn the_debug_form_never_shows_the_key() {
        let c = TlsConfig::new("ca").identity("cert", "SECRET KEY");
        assert!(!format!("{c:?}").contains("SECRET"));
    }
}
