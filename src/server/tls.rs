//! TLS on both ports (rustls with the ring provider).
//!
//! The certificate chain and key are read from PEM files at start and
//! checked against each other, so a wrong pair stops the node with a clear
//! error instead of failing every handshake. The gRPC port offers only
//! `h2` by ALPN; the HTTP port offers `http/1.1` (its server speaks
//! HTTP/1 only).

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

use super::listener::Port;
use crate::config::TlsSettings;

/// Why the certificate or key cannot be used.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("config key {key}: cannot use {path}: {problem}")]
    File {
        /// `server.tls.cert` or `server.tls.key`.
        key: &'static str,
        /// The file as configured.
        path: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// The pair does not fit together, or rustls refused it.
    #[error("server.tls: {0}")]
    Config(String),
}

/// The server certificate and key, loaded and checked.
#[derive(Debug, Clone)]
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl Identity {
    /// Reads and checks the PEM files named in `settings`.
    pub fn load(settings: &TlsSettings) -> Result<Self, TlsError> {
        let chain = read_chain(&settings.cert)?;
        let key = read_key(&settings.key)?;
        let this = Self {
            chain,
            key: Arc::new(key),
        };
        // Builds once to check that the key matches the leaf certificate.
        this.server_config(Port::Grpc)?;
        Ok(this)
    }

    /// The rustls server configuration for `port` (its ALPN protocols).
    pub fn server_config(&self, port: Port) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| {
                TlsError::Config(format!(
                    "the key does not fit the certificate, or one is unsupported: {e} (check that server.tls.key is the private key of the first certificate in server.tls.cert)"
                ))
            })?;
        config.alpn_protocols = match port {
            Port::Grpc => vec![b"h2".to_vec()],
            Port::Http => vec![b"http/1.1".to_vec()],
        };
        Ok(Arc::new(config))
    }

    /// A handshake acceptor for `port`.
    pub fn acceptor(&self, port: Port) -> Result<TlsAcceptor, TlsError> {
        Ok(TlsAcceptor::from(self.server_config(port)?))
    }
}

fn file_error(key: &'static str, path: &Path, problem: impl Into<String>) -> TlsError {
    TlsError::File {
        key,
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e: io::Error| file_error(key, path, e.to_string()))
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    const KEY: &str = "server.tls.cert";
    let pem = read(KEY, path)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(KEY, path, format!("not valid PEM: {e}")))?;
    if chain.is_empty() {
        return Err(file_error(
            KEY,
            path,
            "holds no CERTIFICATE block; give the certificate chain in PEM, leaf first",
        ));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    const KEY: &str = "server.tls.key";
    let pem = read(KEY, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        file_error(
            KEY,
            path,
            format!("holds no usable private key ({e}); give a PEM PRIVATE KEY (PKCS#8), RSA PRIVATE KEY or EC PRIVATE KEY block"),
        )
    })
}
