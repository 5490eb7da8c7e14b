//! TLS on both ports (rustls with the ring provider).
//!
//! The certificate chain and key are read from PEM files at start and
//! checked against each other, so a wrong pair stops the node with a clear
//! error instead of failing every handshake. The gRPC port offers only
//! `h2` by ALPN; the HTTP port offers `http/1.1` (its server speaks
//! HTTP/1 only).

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use idgen_client::pem;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::time::Duration;
use thiserror::Error;
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsSettings;
use crate::metrics as m;

/// Which port a loop serves: the `port` label of the metrics and logs,
/// and the ALPN protocol its TLS offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// gRPC over HTTP/2 only.
    Grpc,
    /// The HTTP/1 port (metrics, health, JSON API).
    Http,
}

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
    /// The certificate new handshakes get; swapped on reload.
    current: Arc<CurrentCert>,
    /// Client certificate checks, when `client_ca` is set.
    clients: Option<Arc<dyn ClientCertVerifier>>,
}

impl Identity {
    /// Reads and checks the PEM files named in `settings`.
    pub fn load(settings: &TlsSettings) -> Result<Self, TlsError> {
        let current = Arc::new(CurrentCert(ArcSwap::from(certified_key(settings)?)));
        let clients = match &settings.client_ca {
            Some(ca) => Some(client_verifier(ca, settings.client_required)?),
            None => None,
        };
        Ok(Self { current, clients })
    }

    /// Reads the files again; on success new handshakes use them, and
    /// connections already open keep theirs. On failure nothing changes.
    pub fn reload(&self, settings: &TlsSettings) -> Result<(), TlsError> {
        self.current.0.store(certified_key(settings)?);
        Ok(())
    }

    /// The rustls server configuration for `port` (its ALPN protocols).
    pub fn server_config(&self, port: Port) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &self.clients {
            Some(v) => builder.with_client_cert_verifier(Arc::clone(v)),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::clone(&self.current) as _);
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

/// The certificate and key in use, swapped whole on reload.
#[derive(Debug)]
struct CurrentCert(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// Reads the chain and key and checks that they belong together.
fn certified_key(settings: &TlsSettings) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_chain(&settings.cert)?;
    let key = read_key(&settings.key)?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .inspect(|ck| record_not_after(&ck.cert))
        .map(Arc::new)
        .map_err(|e| {
            let hint = match &e {
                rustls::Error::InconsistentKeys(_) => " (check that server.tls.key is the private key of the first certificate in server.tls.cert)",
                _ => "",
            };
            TlsError::Config(format!(
                "cert and key cannot be used: {}{hint}",
                pem::certificate_problem(&e)
            ))
        })
}

/// Sets `idgen_tls_cert_not_after_seconds{listener}` of both ports to the
/// not-after time of `chain`'s first certificate (both serve the same
/// certificate); an unparsable one leaves the gauge as it was.
fn record_not_after(chain: &[CertificateDer<'_>]) {
    let Some(leaf) = chain.first() else { return };
    if let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) {
        let not_after = cert.validity().not_after.timestamp() as f64;
        for listener in ["grpc", "http"] {
            metrics::gauge!(m::TLS_CERT_NOT_AFTER, "listener" => listener).set(not_after);
        }
    }
}

/// How often [`watch`] looks at the files' modification times.
pub const RELOAD_POLL: Duration = crate::file_watch::POLL;

/// Reloads `identity` when the certificate or key file changes (checked
/// every [`RELOAD_POLL`]) or on SIGHUP. Each attempt counts in
/// `idgen_tls_reloads_total{result}`; a failed one is logged and keeps the
/// certificate in use. Runs until aborted.
pub async fn watch(identity: Identity, settings: TlsSettings) {
    let paths = vec![settings.cert.clone(), settings.key.clone()];
    crate::file_watch::on_change_or_sighup(paths, |why| match identity.reload(&settings) {
        Ok(()) => {
            metrics::counter!(m::TLS_RELOADS, "result" => "ok").increment(1);
            tracing::info!(why, cert = %settings.cert.display(), "TLS certificate reloaded; new connections use it");
        }
        Err(e) => {
            metrics::counter!(m::TLS_RELOADS, "result" => "error").increment(1);
            tracing::error!(why, error = %e, "TLS certificate reload failed; still serving the previous certificate");
        }
    })
    .await
}

/// Checks client certificates against the CA in `path`; without
/// `required`, a client may send none.
fn client_verifier(path: &Path, required: bool) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    const KEY: &str = "server.tls.client_ca";
    let roots = pem::read_ca_roots(path).map_err(|e| file_error(KEY, path, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder
        .build()
        .map_err(|e| file_error(KEY, path, e.to_string()))
}

/// Who the client's certificate names: its subject CNs and its SAN DNS
/// names, emails and URIs. Known only once the handshake has checked the
/// certificate against `server.tls.client_ca`.
#[derive(Debug, Clone, Default)]
pub struct PeerCertificate {
    /// Every name, CNs first.
    pub names: Arc<[String]>,
}

impl PeerCertificate {
    /// The names of a verified leaf certificate (DER); unparsable parts
    /// give no names.
    pub fn from_der(der: &[u8]) -> Self {
        let mut names = Vec::new();
        if let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) {
            for cn in cert.subject().iter_common_name() {
                if let Ok(s) = cn.as_str() {
                    names.push(s.to_owned());
                }
            }
            if let Ok(Some(san)) = cert.subject_alternative_name() {
                for name in &san.value.general_names {
                    use x509_parser::extensions::GeneralName as G;
                    match name {
                        G::DNSName(s) | G::RFC822Name(s) | G::URI(s) => names.push((*s).to_owned()),
                        _ => {}
                    }
                }
            }
        }
        Self {
            names: names.into(),
        }
    }

    /// Whether any name is in `allowed` (exact match).
    pub fn any_in(&self, allowed: &[String]) -> bool {
        self.names.iter().any(|n| allowed.iter().any(|a| a == n))
    }
}

fn file_error(key: &'static str, path: &Path, problem: impl Into<String>) -> TlsError {
    TlsError::File {
        key,
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    pem::read_certificates(path).map_err(|e| file_error("server.tls.cert", path, e.to_string()))
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    pem::read_private_key(path).map_err(|e| file_error("server.tls.key", path, e.to_string()))
}

/// The name the Consul agent's gRPC probe checks this node's certificate
/// against (the check's `TLSServerName`): `configured`
/// (`consul.check_tls_server_name`) if set, which the certificate must
/// carry; else the advertised IP if the certificate carries it; else the
/// certificate's first DNS name that is not a wildcard. Anything else
/// would leave the check critical forever, so it stops the start instead.
pub fn check_server_name(
    settings: &TlsSettings,
    advertise: std::net::IpAddr,
    configured: Option<&str>,
) -> Result<String, TlsError> {
    use x509_parser::extensions::GeneralName as G;
    let chain = read_chain(&settings.cert)?;
    let (dns, ips) = match x509_parser::parse_x509_certificate(&chain[0]) {
        Ok((_, cert)) => {
            let (mut dns, mut ips) = (Vec::new(), Vec::new());
            if let Ok(Some(san)) = cert.subject_alternative_name() {
                for name in &san.value.general_names {
                    match name {
                        G::DNSName(s) => dns.push(s.to_ascii_lowercase()),
                        G::IPAddress(b) => ips.extend(ip_of(b)),
                        _ => {}
                    }
                }
            }
            (dns, ips)
        }
        Err(e) => {
            return Err(file_error(
                "server.tls.cert",
                &settings.cert,
                format!("the first certificate does not parse: {e}"),
            ))
        }
    };
    let carried = |name: &str| match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ips.contains(&ip),
        Err(_) => {
            let name = name.to_ascii_lowercase();
            dns.iter().any(|d| match d.strip_prefix("*.") {
                Some(rest) => name
                    .split_once('.')
                    .is_some_and(|(label, tail)| !label.is_empty() && tail == rest),
                None => *d == name,
            })
        }
    };
    if let Some(name) = configured {
        if !carried(name) {
            return Err(TlsError::Config(format!(
                "consul.check_tls_server_name {name:?} is not among the names of server.tls.cert (DNS {dns:?}, IP {ips:?}): the Consul agent's gRPC check would fail; use one of them"
            )));
        }
        return Ok(name.to_owned());
    }
    if ips.contains(&advertise) {
        return Ok(advertise.to_string());
    }
    dns.iter()
        .find(|d| !d.starts_with("*."))
        .cloned()
        .ok_or_else(|| {
            TlsError::Config(format!(
                "server.tls.cert carries neither the advertised IP {advertise} nor a DNS name without a wildcard (DNS {dns:?}, IP {ips:?}), so the Consul agent's gRPC check could not verify it: set consul.check_tls_server_name to a name the certificate carries"
            ))
        })
}

/// An IP address SAN (4 or 16 bytes).
fn ip_of(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        _ => None,
    }
}
