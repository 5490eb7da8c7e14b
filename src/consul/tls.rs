//! HTTPS to Consul: the CA that signed the agent's certificate, an
//! optional client certificate (for an agent with `verify_incoming`), and
//! an optional server name to verify instead of the address's host, like
//! Consul's own `CONSUL_TLS_SERVER_NAME`.
//!
//! The files are read and checked when the configuration is validated, so
//! a missing or wrong file stops the node before it talks to Consul, with
//! the config key and the file named. They are read again when they
//! change or on SIGHUP ([`watch`]): certificates that rotate (short-lived
//! ones from Vault or `consul tls cert create`) are used by the next
//! connection, and a reload that fails keeps the files in use. rustls with
//! the ring provider; the address's scheme decides whether TLS is used.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use idgen_client::pem;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use thiserror::Error;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{
    self, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::metrics as m;

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

/// A loaded, checked TLS client setup for Consul. Cheap to clone: clones
/// share the material, so [`ConsulTls::reload`] reaches every client built
/// from any of them.
#[derive(Clone)]
pub struct ConsulTls {
    config: Arc<ClientConfig>,
    files: ConsulTlsFiles,
    current: Arc<ArcSwap<Material>>,
}

impl fmt::Debug for ConsulTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// What the files hold, swapped whole on reload.
struct Material {
    /// Checks the agent's certificate against the CA.
    verifier: Arc<WebPkiServerVerifier>,
    /// The name to check it against instead of the address's host
    /// (`consul.tls_server_name`).
    name: Option<ServerName<'static>>,
    /// The client certificate and its key, when configured.
    client: Option<Arc<CertifiedKey>>,
}

impl ConsulTls {
    /// Reads and checks the files: the CA must hold at least one usable
    /// certificate, the client certificate and key must belong together.
    pub fn load(files: &ConsulTlsFiles) -> Result<Self, ConsulTlsError> {
        let material = Material::read(files)?;
        let has_client = material.client.is_some();
        let current = Arc::new(ArcSwap::from_pointee(material));
        let verifier = Arc::new(CurrentVerifier(Arc::clone(&current)));
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| error("consul.ca_file", &files.ca_file, e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = if has_client {
            builder.with_client_cert_resolver(Arc::new(CurrentClientCert(Arc::clone(&current))))
        } else {
            builder.with_no_client_auth()
        };
        // The Consul client speaks HTTP/1.1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            files: files.clone(),
            current,
        })
    }

    /// Reads the files again and, when every one of them is usable, swaps
    /// them in: the next connection to Consul uses them (connections open
    /// now keep theirs). On an error nothing changes. The set of files is
    /// fixed by the configuration: a client certificate can be replaced,
    /// not added or removed.
    pub fn reload(&self) -> Result<(), ConsulTlsError> {
        let material = Material::read(&self.files)?;
        self.current.store(Arc::new(material));
        Ok(())
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

impl Material {
    fn read(files: &ConsulTlsFiles) -> Result<Self, ConsulTlsError> {
        let roots = read_roots("consul.ca_file", &files.ca_file)?;
        let provider = provider();
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
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
        let client = match (&files.cert_file, &files.key_file) {
            (Some(cert), Some(key)) => {
                let chain = read_chain("consul.cert_file", cert)?;
                let key_der = read_key("consul.key_file", key)?;
                let certified = CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| {
                    error(
                        "consul.key_file",
                        key,
                        format!(
                            "does not fit consul.cert_file {}: {}",
                            cert.display(),
                            pem::certificate_problem(&e)
                        ),
                    )
                })?;
                Some(Arc::new(certified))
            }
            (None, None) => None,
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
        Ok(Self {
            verifier,
            name,
            client,
        })
    }
}

/// How often [`watch`] looks at the files' modification times.
pub const RELOAD_POLL: Duration = crate::file_watch::POLL;

/// Reloads `tls` when one of its files changes (checked every
/// [`RELOAD_POLL`]) or on SIGHUP. Each attempt counts in
/// `idgen_consul_tls_reloads_total{result}`; a failed one is logged and
/// keeps the files in use. Runs until aborted.
pub async fn watch(tls: ConsulTls) {
    let files = tls.files().clone();
    let paths = [
        Some(files.ca_file.clone()),
        files.cert_file.clone(),
        files.key_file.clone(),
    ]
    .into_iter()
    .flatten()
    .collect();
    crate::file_watch::on_change_or_sighup(paths, |why| match tls.reload() {
        Ok(()) => {
            metrics::counter!(m::CONSUL_TLS_RELOADS, "result" => "ok").increment(1);
            tracing::info!(why, ca = %files.ca_file.display(), "Consul TLS files reloaded; new connections to Consul use them");
        }
        Err(e) => {
            metrics::counter!(m::CONSUL_TLS_RELOADS, "result" => "error").increment(1);
            tracing::error!(why, error = %e, "Consul TLS reload failed; still using the previous files");
        }
    })
    .await
}

/// The verifier of the material in use: the chain against the CA, and
/// the name against `consul.tls_server_name` when set (Consul's
/// `server_name`: for an agent reached by IP, or through a name its
/// certificate does not carry), else the address's host.
#[derive(Debug)]
struct CurrentVerifier(Arc<ArcSwap<Material>>);

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Material")
            .field("client", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl ServerCertVerifier for CurrentVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let current = self.0.load();
        let name = current.name.as_ref().unwrap_or(server_name);
        current
            .verifier
            .verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .load()
            .verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .load()
            .verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.load().verifier.supported_verify_schemes()
    }
}

/// The client certificate of the material in use.
#[derive(Debug)]
struct CurrentClientCert(Arc<ArcSwap<Material>>);

impl ResolvesClientCert for CurrentClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.0.load().client.clone()
    }

    fn has_certs(&self) -> bool {
        self.0.load().client.is_some()
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
    pem::read_certificates(path).map_err(|e| error(key, path, e.to_string()))
}

fn read_roots(key: &'static str, path: &Path) -> Result<RootCertStore, ConsulTlsError> {
    pem::read_ca_roots(path).map_err(|e| error(key, path, e.to_string()))
}

fn read_key(key: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, ConsulTlsError> {
    pem::read_private_key(path).map_err(|e| error(key, path, e.to_string()))
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

    /// A self-signed certificate for `localhost`: (cert PEM, key PEM, DER).
    fn self_signed() -> (String, String, CertificateDer<'static>) {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("rcgen");
        (
            ck.cert.pem(),
            ck.signing_key.serialize_pem(),
            ck.cert.der().clone(),
        )
    }

    /// A TLS server that requires a client certificate signed by one of
    /// `clients` and reports the one each connection presented.
    async fn recording_server(
        server: &(String, String, CertificateDer<'static>),
        clients: &[CertificateDer<'static>],
    ) -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<CertificateDer<'static>>,
    ) {
        let mut roots = RootCertStore::empty();
        for c in clients {
            roots.add(c.clone()).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        let chain = vec![server.2.clone()];
        let key = pem::private_key(server.1.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Ok(conn) = acceptor.accept(tcp).await {
                        if let Some(cert) =
                            conn.get_ref().1.peer_certificates().and_then(|c| c.first())
                        {
                            let _ = tx.send(cert.clone().into_owned());
                        }
                    }
                });
            }
        });
        (addr, rx)
    }

    /// One handshake with `tls`'s client configuration.
    async fn handshake(tls: &ConsulTls, addr: std::net::SocketAddr) -> Result<(), String> {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(tls.client_config().clone()))
            .connect(name, tcp)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The client certificate the server saw next (bounded wait).
    async fn presented(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<CertificateDer<'static>>,
    ) -> CertificateDer<'static> {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the server finished a handshake")
            .expect("server running")
    }

    #[tokio::test]
    async fn reload_swaps_the_ca_and_client_certificate_and_a_bad_file_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (agent, other_agent) = (self_signed(), self_signed());
        let (first, second) = (self_signed(), self_signed());
        let (addr, mut seen) = recording_server(&agent, &[first.2.clone(), second.2.clone()]).await;
        let files = ConsulTlsFiles {
            ca_file: dir.path().join("ca.pem"),
            cert_file: Some(dir.path().join("client.pem")),
            key_file: Some(dir.path().join("client.key")),
            server_name: None,
        };
        let write = |ca: &str, client: &(String, String, CertificateDer<'static>)| {
            std::fs::write(&files.ca_file, ca).unwrap();
            std::fs::write(files.cert_file.as_ref().unwrap(), &client.0).unwrap();
            std::fs::write(files.key_file.as_ref().unwrap(), &client.1).unwrap();
        };

        // The wrong CA: the agent's certificate is refused.
        write(&other_agent.0, &first);
        let tls = ConsulTls::load(&files).unwrap();
        let e = handshake(&tls, addr).await.unwrap_err();
        assert!(
            e.contains("UnknownIssuer") || e.contains("invalid peer certificate"),
            "{e}"
        );

        // The right CA and another client certificate, reloaded: a client
        // built before the reload (a clone) uses them.
        let client = tls.clone();
        write(&agent.0, &second);
        tls.reload().unwrap();
        handshake(&client, addr).await.unwrap();
        assert_eq!(
            presented(&mut seen).await,
            second.2,
            "the new client certificate"
        );

        // A key that does not fit: refused, naming the key; nothing changes.
        std::fs::write(files.key_file.as_ref().unwrap(), &first.1).unwrap();
        let e = tls.reload().unwrap_err();
        assert_eq!(e.key, "consul.key_file", "{e}");
        handshake(&client, addr).await.unwrap();
        assert_eq!(
            presented(&mut seen).await,
            second.2,
            "still the previous one"
        );
        std::fs::write(&files.ca_file, "not PEM").unwrap();
        assert_eq!(tls.reload().unwrap_err().key, "consul.ca_file");
        handshake(&client, addr).await.unwrap();
        assert_eq!(presented(&mut seen).await, second.2);

        // watch(): files that change are picked up without a call. They
        // are written again each round: the watcher notes the files'
        // times when it first runs, which may be after a first write.
        let watcher = tokio::spawn(watch(tls.clone()));
        let mut now = None;
        for _ in 0..50 {
            write(&agent.0, &first);
            tokio::time::sleep(Duration::from_millis(300)).await;
            handshake(&client, addr).await.unwrap();
            let cert = presented(&mut seen).await;
            if cert == first.2 {
                now = Some(cert);
                break;
            }
        }
        watcher.abort();
        assert_eq!(now, Some(first.2), "the watcher reloaded the changed files");
    }
}
