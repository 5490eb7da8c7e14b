//! TLS to idgen nodes (rustls with the ring provider): the CA that signed
//! the nodes' certificates, an optional client certificate for nodes that
//! require one (mTLS), and an optional server name for nodes that are
//! known by IP address while their certificates name a host.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ClientConfig};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

use crate::{pem, Error};

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

    /// [`TlsConfig::new`] with the CA read from a PEM file, checked now:
    /// an error names the file and what is wrong with it.
    pub fn from_ca_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        Ok(Self::new(read("CA", path, |pem| {
            pem::ca_roots(pem).map(drop)
        })?))
    }

    /// Present this client certificate chain and private key (PEM) to
    /// nodes that ask for one (the node's `server.tls.client_ca`).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// [`TlsConfig::identity`] with both read from PEM files, each checked
    /// now: an error names the file and what is wrong with it.
    pub fn identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, Error> {
        let cert = read("client certificate", cert.as_ref(), |pem| {
            pem::certificates(pem).map(drop)
        })?;
        let key = read("client key", key.as_ref(), |pem| {
            pem::private_key(pem).map(drop)
        })?;
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
        let roots = pem::ca_roots(&self.ca_pem).map_err(|e| bad("CA", &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => {
                let chain = pem::certificates(cert).map_err(|e| bad("client certificate", &e))?;
                let key = pem::private_key(key).map_err(|e| bad("client key", &e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("client certificate and key", &pem::certificate_problem(&e)))?
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

/// The file at `path`, checked by `check`; errors name `what` and the file.
fn read(
    what: &str,
    path: &Path,
    check: impl FnOnce(&[u8]) -> Result<(), pem::PemError>,
) -> Result<Vec<u8>, Error> {
    let bad = |e: pem::PemError| Error::Config(format!("TLS {what} {}: {e}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(e.into()))?;
    check(&bytes).map_err(bad)?;
    Ok(bytes)
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
        Ok(endpoint.connect_with_connector_lazy(self.dialer(addr)?))
    }

    /// What dials `addr` (`host:port`): TCP, then the TLS handshake
    /// against the configured server name, else the address's host.
    fn dialer(
        &self,
        addr: &str,
    ) -> Result<
        impl tower::Service<
                tonic::codegen::http::Uri,
                Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
                Error = std::io::Error,
                Future = impl Send,
            > + Clone
            + Send
            + 'static,
        String,
    > {
        let (host, port) = split(addr)?;
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => ServerName::try_from(host.clone()).map_err(|e| {
                format!("node address {addr:?}: {host:?} is not a TLS server name: {e}")
            })?,
        };
        let config = Arc::clone(&self.config);
        Ok(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let (config, name, host) = (Arc::clone(&config), name.clone(), host.clone());
            async move {
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                let _ = tcp.set_nodelay(true);
                let tls = TlsConnector::from(config).connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
    }
}

impl TlsConfig {
    /// Dials `addr` (`host:port`) over TLS now, not at the first call,
    /// for a tool that dials one node itself (the `idgen` command): a node
    /// that does not speak TLS, or whose certificate is not trusted, fails
    /// here, as an [`Error::Transport`] whose cause is [`tls_refusal`]'s
    /// words with `remedies` (the tool's own settings), then the error.
    pub async fn connect(
        &self,
        addr: &str,
        endpoint: Endpoint,
        remedies: &TlsRemedies,
    ) -> Result<Channel, Error> {
        let connector = self.build()?;
        let dialer = connector.dialer(addr).map_err(Error::Config)?;
        endpoint.connect_with_connector(dialer).await.map_err(|e| {
            let (text, cause) = chain_text(&e);
            let has = |w: &str| text.contains(w);
            // The handshake did not finish: a node that cut it (end of
            // file, reset) without a TLS alert speaks something else.
            let cut = (has("eof") || has("reset") || has("connection closed")) && !has("alert");
            let words = match tls_refusal(&text, connector.tls_use(), remedies) {
                Some(words) if !cut || has("certificate") => words,
                _ if cut => not_tls(remedies),
                _ => generic_words(&text).to_owned(),
            };
            Error::Transport {
                node: addr.to_owned(),
                cause: format!("{words} ({cause})"),
            }
        })
    }
}

/// The lowercased Debug and Display text of `e` and its sources, and the
/// innermost one's Display text (the cause to show).
fn chain_text(e: &(dyn std::error::Error + 'static)) -> (String, String) {
    let (mut text, mut cause) = (String::new(), e.to_string());
    let mut next = Some(e);
    while let Some(err) = next {
        text.push_str(&format!(" {err:?} {err}"));
        cause = err.to_string();
        next = err.source();
    }
    (text.to_ascii_lowercase(), cause)
}

/// Whether the client speaks TLS to the nodes, and presents a client
/// certificate: what the words of a failed connection depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsUse {
    /// No [`ClientBuilder::tls`](crate::ClientBuilder::tls) (a plaintext
    /// address in the `idgen` command).
    Plaintext,
    /// TLS, with or without [`TlsConfig::identity`].
    Tls {
        /// A client certificate is set.
        identity: bool,
    },
}

/// The settings a TLS refusal tells the user to change, by the names of
/// one front end: this crate's API ([`TlsRemedies::CLIENT`]) or the
/// `idgen` command's flags. The words around them are [`tls_refusal`]'s,
/// the same for every front end.
#[derive(Debug, Clone, Copy)]
pub struct TlsRemedies {
    /// Where the CA that signed the nodes' certificates is given.
    pub ca: &'static str,
    /// Where the name to check the nodes' certificates against is given.
    pub server_name: &'static str,
    /// Where the client certificate and key are given.
    pub identity: &'static str,
    /// How to present a client certificate, when none is.
    pub add_identity: &'static str,
    /// How to speak TLS, to a node that does.
    pub use_tls: &'static str,
    /// How to speak plaintext, to a node that does.
    pub use_plaintext: &'static str,
}

impl TlsRemedies {
    /// This crate's settings.
    pub const CLIENT: Self = Self {
        ca: "the CA of TlsConfig",
        server_name: "TlsConfig::server_name",
        identity: "TlsConfig::identity",
        add_identity: "set TlsConfig::identity (or TlsConfig::identity_files(cert, key))",
        use_tls: "set ClientBuilder::tls",
        use_plaintext: "drop ClientBuilder::tls",
    };
}

/// A failed connection or call that is about TLS, in words that say what
/// to do (naming `remedies`), from the text of its cause (any case; the
/// Debug text of rustls errors included) and how the client speaks TLS;
/// `None` when it is not about TLS. Never tells a client that speaks TLS
/// to set it. The one set of these words: this crate's calls and the
/// `idgen` command both use it.
pub fn tls_refusal(cause: &str, tls: TlsUse, remedies: &TlsRemedies) -> Option<String> {
    let lower = cause.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    let identity = matches!(tls, TlsUse::Tls { identity: true });
    let r = remedies;
    if has(&["unsupportedcertversion"]) {
        return Some(format!(
            "TLS: the node's certificate is refused: {}",
            pem::V1_CERTIFICATE
        ));
    }
    if has(&["certificaterequired"]) {
        return Some(if identity {
            format!(
                "TLS: the node requires a client certificate and did not take this one: check {}",
                r.identity
            )
        } else {
            format!(
                "TLS: the node requires a client certificate: {}",
                r.add_identity
            )
        });
    }
    let refused = [
        "badcertificate",
        "unknownca",
        "certificateunknown",
        "unsupportedcertificate",
        "certificateexpired",
        "certificaterevoked",
        "accessdenied",
    ];
    if identity && has(&refused) {
        return Some(format!("TLS: the node refused the client certificate ({}): it must be signed by the node's server.tls.client_ca, unexpired, X.509 v3 with clientAuth usage", r.identity));
    }
    if has(&["invalidcertificate", "certificate"]) {
        return Some(format!("TLS: the node's certificate is not trusted: check {}, and that the address's host (or {}) is in the certificate", r.ca, r.server_name));
    }
    if has(&[
        "corrupt message",
        "invalidcontenttype",
        "invalid content type",
    ]) {
        return Some(not_tls(r));
    }
    // A TLS 1.3 node refuses a missing client certificate after the
    // client's side of the handshake is done: the call then sees the
    // alert, or, when its request raced it, only the connection closing.
    let broke = has(&["frame with invalid size", "reset", "broken pipe"]);
    // hyper's words for a connection that closed under a call in flight.
    let closed = has(&["connection closed", "operation was canceled"]);
    match tls {
        TlsUse::Plaintext if broke => Some(format!(
            "the connection broke; the node may speak TLS: {}",
            r.use_tls
        )),
        TlsUse::Tls { identity: false } if broke || closed => Some(format!(
            "the connection closed during or right after the TLS handshake: if the node requires a client certificate (server.tls.client_required), {}",
            r.add_identity
        )),
        TlsUse::Tls { identity: true } if broke || closed => Some(
            "the connection closed during or right after the TLS handshake (the node may have refused the client certificate)".into()
        ),
        _ => None,
    }
}

/// A node that answered a TLS handshake in plaintext.
fn not_tls(r: &TlsRemedies) -> String {
    format!(
        "TLS: the node does not speak TLS; it serves plaintext: {}",
        r.use_plaintext
    )
}

/// What went wrong with a connection, in words that say what to do, from
/// its innermost `cause` and how this crate's client speaks TLS.
pub(crate) fn failure_words(cause: &str, tls: TlsUse) -> String {
    tls_refusal(cause, tls, &TlsRemedies::CLIENT)
        .unwrap_or_else(|| generic_words(&cause.to_ascii_lowercase()).to_owned())
}

/// A failed connection that is not about TLS; `lower` is its cause in
/// lowercase.
fn generic_words(lower: &str) -> &'static str {
    if lower.contains("refused") {
        return "connection refused: nothing listens there (is idgen serving at this address? A node that is shutting down or restarting refuses connections too)";
    }
    if ["timed out", "timeout", "elapsed"]
        .iter()
        .any(|w| lower.contains(w))
    {
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
