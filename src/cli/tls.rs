//! TLS for the CLI's gRPC connections: `https://` addresses, `--ca`,
//! `--cert`, `--key`, and telling which side speaks what when a plaintext
//! client meets a TLS node or the other way round.

use std::io;
use std::net::{TcpStream as StdTcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

/// The TLS options of every command that dials a node.
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// CA certificate(s), PEM, that signed the node's certificate; needed
    /// for https:// addresses.
    #[arg(long = "ca", id = "tls_ca", value_name = "FILE", global = true)]
    pub ca: Option<PathBuf>,
    /// Client certificate chain, PEM, for nodes that ask for one (mTLS).
    #[arg(
        long = "cert",
        id = "tls_cert",
        value_name = "FILE",
        global = true,
        requires = "tls_key"
    )]
    pub cert: Option<PathBuf>,
    /// Private key of --cert, PEM.
    #[arg(
        long = "key",
        id = "tls_key",
        value_name = "FILE",
        global = true,
        requires = "tls_cert"
    )]
    pub key: Option<PathBuf>,
    /// Check the node's certificate against this name instead of the
    /// address's host: needed with `--discover` (Consul gives IP addresses)
    /// when the certificates name a DNS name such as `idgen.internal`.
    #[arg(
        long = "tls-server-name",
        id = "tls_server_name",
        value_name = "NAME",
        global = true,
        requires = "tls_ca"
    )]
    pub server_name: Option<String>,
}

impl TlsArgs {
    /// The rustls client configuration these options describe (ALPN h2).
    pub fn client_config(&self) -> anyhow::Result<Arc<ClientConfig>> {
        let Some(ca) = &self.ca else {
            bail!("an https:// address needs --ca <file>: the CA certificate (PEM) that signed the node's certificate");
        };
        let mut roots = RootCertStore::empty();
        for cert in read_certs("--ca", ca)? {
            roots
                .add(cert)
                .map_err(|e| anyhow!("--ca {}: not a usable CA certificate: {e}", ca.display()))?;
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = read_certs("--cert", cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| anyhow!("--key {}: no usable private key: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("--cert and --key do not fit together")?
            }
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// The idgen-client TLS settings of these options: `None` without
    /// `--ca` (plaintext), an error for `--cert` without `--ca`.
    pub fn client_tls(&self) -> anyhow::Result<Option<idgen_client::TlsConfig>> {
        let Some(ca) = &self.ca else {
            if self.any() {
                bail!("--cert and --key need --ca: the CA certificate (PEM) that signed the nodes' certificates");
            }
            return Ok(None);
        };
        let mut tls = idgen_client::TlsConfig::from_ca_file(ca)?;
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity_files(cert, key)?;
        }
        if let Some(name) = &self.server_name {
            check_server_name(name)?;
            tls = tls.server_name(name.trim());
        }
        Ok(Some(tls))
    }

    /// Whether any TLS option was given.
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.server_name.is_some()
    }
}

/// `--tls-server-name` as rustls takes it, or an error saying what is wrong.
fn check_server_name(name: &str) -> anyhow::Result<ServerName<'static>> {
    ServerName::try_from(name.trim().to_owned()).map_err(|e| {
        anyhow!("--tls-server-name {name:?} is not a DNS name or IP address ({e}): give the name the nodes' certificates carry, e.g. idgen.internal")
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(flag: &str, path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow!("{flag} {}: cannot read certificates: {e}", path.display()))?;
    if certs.is_empty() {
        bail!("{flag} {}: holds no PEM CERTIFICATE block", path.display());
    }
    Ok(certs)
}

/// Connects over TLS to the node at `url` (https://host:port); every
/// failure says what to do, and a node that answers in plaintext is named
/// as such.
pub async fn connect(
    endpoint: Endpoint,
    url: &url::Url,
    config: Arc<ClientConfig>,
    server_name: Option<&str>,
) -> anyhow::Result<Channel> {
    let host = url
        .host_str()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_owned();
    let port = url.port().unwrap_or(443);
    let name = match server_name {
        Some(name) => check_server_name(name)?,
        None => ServerName::try_from(host.clone())
            .map_err(|e| anyhow!("{url}: {host:?} is not a usable TLS server name: {e}"))?,
    };
    let connector = tower::service_fn(move |_: hyper::Uri| {
        let (config, name, host) = (Arc::clone(&config), name.clone(), host.clone());
        async move {
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map(TokioIo::new)
        }
    });
    endpoint.connect_with_connector(connector).await.map_err(|e| {
        let cause = super::client::root_cause(&e);
        let source: &(dyn std::error::Error + 'static) = &e;
        match rustls_error(source) {
            Some(rustls::Error::InvalidCertificate(c)) => anyhow!(
                "cannot connect to {url}: the node's certificate is not trusted ({c:?}); check --ca, and that the address's host (or --tls-server-name) is in the certificate"
            ),
            Some(rustls::Error::InvalidMessage(_)) | None if looks_plaintext(&cause) => anyhow!(
                "cannot connect to {url}: the node does not speak TLS ({cause}); it serves plaintext: use http://{}:{port}",
                url.host_str().unwrap_or_default()
            ),
            _ => anyhow!("cannot connect to {url} over TLS ({cause})"),
        }
    })
}

/// What a TLS client sees when the server answers in plaintext HTTP/2
/// (a SETTINGS frame) or closes on the ClientHello.
fn looks_plaintext(cause: &str) -> bool {
    let c = cause.to_ascii_lowercase();
    c.contains("corrupt message")
        || c.contains("invalid content type")
        || c.contains("eof")
        || c.contains("reset")
        || c.contains("invalidcontenttype")
}

fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if let Some(r) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(r);
            }
        }
        cur = err.source();
    }
    None
}

/// Whether the server at `host:port` answers a TLS ClientHello in TLS (a
/// plaintext node closes or answers HTTP/2 instead). Used only to explain
/// a failed plaintext call; bounded by `timeout`.
pub fn speaks_tls(host: &str, port: u16, timeout: Duration) -> bool {
    let probe = || -> Option<bool> {
        let addr = (host.trim_matches(['[', ']']), port)
            .to_socket_addrs()
            .ok()?
            .next()?;
        let mut sock = StdTcpStream::connect_timeout(&addr, timeout).ok()?;
        sock.set_read_timeout(Some(timeout)).ok()?;
        sock.set_write_timeout(Some(timeout)).ok()?;
        // No roots: a TLS server's certificate fails verification, which
        // is the proof it speaks TLS.
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        let name = ServerName::try_from("idgen.invalid").ok()?;
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
        for _ in 0..8 {
            match conn.complete_io(&mut sock) {
                Ok(_) if !conn.is_handshaking() => return Some(true),
                Ok(_) => {}
                Err(e) => {
                    let r = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
                    return Some(matches!(
                        r,
                        Some(
                            rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)
                        )
                    ));
                }
            }
        }
        None
    };
    probe().unwrap_or(false)
}
