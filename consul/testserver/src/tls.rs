//! TLS for the agents' HTTPS port and for gRPC checks with `GRPCUseTLS`
//! (rustls with ring).
//!
//! A plaintext request on the HTTPS port is answered the way Go's HTTP
//! server (and so Consul) answers it: `400 Bad Request`, body `Client sent
//! an HTTP request to an HTTPS server.`, then the connection closes.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::{CheckTlsConfig, HttpsConfig};

/// What Go's `net/http` writes to a plaintext request on a TLS port.
const PLAINTEXT_REPLY: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// Longest a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn invalid(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: {e}"))
}

fn certs(what: &str, pem: &[u8]) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, e))?;
    if certs.is_empty() {
        return Err(invalid(what, "no PEM CERTIFICATE block"));
    }
    Ok(certs)
}

fn roots(what: &str, pem: &[u8]) -> io::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certs(what, pem)? {
        roots.add(cert).map_err(|e| invalid(what, e))?;
    }
    Ok(roots)
}

/// The acceptor of the HTTPS port (ALPN `http/1.1`: the agent speaks
/// HTTP/1 only).
pub(crate) fn acceptor(https: &HttpsConfig) -> io::Result<Arc<ServerConfig>> {
    let chain = certs("HTTPS certificate", &https.cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(&https.key_pem).map_err(|e| invalid("HTTPS key", e))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("TLS", e))?;
    let builder = match &https.client_ca_pem {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots("client CA", ca)?),
                provider(),
            )
            .build()
            .map_err(|e| invalid("client CA", e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| invalid("HTTPS certificate and key", e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Completes the handshake of one connection; a plaintext request gets
/// Go's 400 answer and `None`, as does a failed handshake.
pub(crate) async fn accept(
    acceptor: &TlsAcceptor,
    mut stream: TcpStream,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await;
    if !matches!(peeked, Ok(Ok(1))) {
        return None;
    }
    // 0x16: a TLS handshake record. Anything else is plaintext.
    if first[0] != 0x16 {
        let _ = stream.write_all(PLAINTEXT_REPLY).await;
        let _ = stream.shutdown().await;
        return None;
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => None,
    }
}

/// The client configuration of gRPC probes with `GRPCUseTLS` (ALPN h2).
pub(crate) fn probe_config(check: &CheckTlsConfig) -> Result<Arc<ClientConfig>, String> {
    let roots = match &check.ca_pem {
        Some(ca) => roots("check CA", ca).map_err(|e| e.to_string())?,
        None => RootCertStore::empty(),
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match &check.client_pem {
        Some((cert, key)) => {
            let chain = certs("check client certificate", cert).map_err(|e| e.to_string())?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| e.to_string())?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| e.to_string())?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Opens a TLS connection to `target` (`host:port`) verified against
/// `server_name`, or the target's host when that is empty.
pub(crate) async fn connect(
    config: Arc<ClientConfig>,
    target: &str,
    server_name: &str,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let host = match target.rsplit_once(':') {
        Some((host, _)) => host.trim_matches(['[', ']']),
        None => target,
    };
    let name = if server_name.is_empty() {
        host
    } else {
        server_name
    };
    let name = ServerName::try_from(name.to_owned()).map_err(|e| invalid("server name", e))?;
    let tcp = TcpStream::connect(target).await?;
    let _ = tcp.set_nodelay(true);
    TlsConnector::from(config).connect(name, tcp).await
}
