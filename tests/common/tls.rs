//! Certificates made in the test (rcgen) and TLS clients that trust them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use idgen::proto::id_gen_client::IdGenClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

/// A self-signed server certificate for `localhost` and 127.0.0.1, written
/// as PEM files.
pub struct ServerCert {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: CertificateDer<'static>,
}

/// Writes a fresh certificate and key under `dir` with `name` as prefix.
pub fn server_cert(dir: &Path, name: &str) -> ServerCert {
    self_signed_cert(dir, name, &["localhost", "127.0.0.1"])
}

/// [`server_cert`] for the names `sans` only.
pub fn self_signed_cert(dir: &Path, name: &str, sans: &[&str]) -> ServerCert {
    let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
    let ck = rcgen::generate_simple_self_signed(sans).expect("rcgen");
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    ServerCert {
        cert,
        key,
        der: ck.cert.der().clone(),
    }
}

/// A rustls client trusting only `roots`, offering `alpn`.
pub fn client_config(roots: &[CertificateDer<'static>], alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut store = RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(c)
}

/// Opens a TLS connection to `addr` (server name `localhost`).
pub async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(config).connect(name, tcp).await
}

/// A gRPC client over TLS to `addr`, trusting `root`.
pub async fn grpc_client(
    addr: SocketAddr,
    root: &CertificateDer<'static>,
) -> Result<IdGenClient<Channel>, tonic::transport::Error> {
    let config = client_config(std::slice::from_ref(root), &[b"h2"]);
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: hyper::Uri| {
            let config = Arc::clone(&config);
            async move { connect(addr, config).await.map(TokioIo::new) }
        }))
        .await?;
    Ok(IdGenClient::new(channel))
}

/// One HTTP/1.1 GET over TLS; returns the whole response as text.
pub async fn https_get(addr: SocketAddr, root: &CertificateDer<'static>, path: &str) -> String {
    let config = client_config(std::slice::from_ref(root), &[b"http/1.1"]);
    let mut s = connect(addr, config).await.expect("TLS connect");
    let alpn = s.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    assert_eq!(
        alpn.as_deref(),
        Some(&b"http/1.1"[..]),
        "ALPN on the HTTP port"
    );
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// A certificate authority made in the test.
pub struct Ca {
    /// The CA certificate, PEM file.
    pub cert: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A fresh CA, written to `dir/<name>-ca.crt`.
pub fn ca(dir: &Path, name: &str) -> Ca {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} test CA"));
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let path = dir.join(format!("{name}-ca.crt"));
    std::fs::write(&path, cert.pem()).unwrap();
    Ca {
        cert: path,
        issuer: rcgen::Issuer::new(params, key),
    }
}

/// A client certificate with subject `cn` and DNS SANs `sans`, signed by
/// `ca`; returns the PEM files (cert, key).
pub fn client_cert(dir: &Path, ca: &Ca, cn: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
    let mut params =
        rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let (c, k) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// A gRPC client over TLS trusting `root` and presenting the client
/// certificate `(cert, key)` PEM files.
pub async fn grpc_client_with_cert(
    addr: SocketAddr,
    root: &CertificateDer<'static>,
    (cert, key): (&Path, &Path),
) -> Result<IdGenClient<Channel>, tonic::transport::Error> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::PrivateKeyDer;
    let mut store = RootCertStore::empty();
    store.add(root.clone()).unwrap();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_client_auth_cert(chain, key)
        .unwrap();
    c.alpn_protocols = vec![b"h2".to_vec()];
    let config = Arc::new(c);
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: hyper::Uri| {
            let config = Arc::clone(&config);
            async move { connect(addr, config).await.map(TokioIo::new) }
        }))
        .await?;
    Ok(IdGenClient::new(channel))
}

/// A certificate for both ends of a connection (server and client
/// authentication), subject `cn`, SANs `sans` (DNS names, or IPs when they
/// parse as one), signed by `ca`; returns the PEM files (cert, key).
pub fn leaf_cert(dir: &Path, ca: &Ca, cn: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
    let mut params =
        rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let (c, k) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// The DER of the first certificate in a PEM file (a CA, to trust).
pub fn der_of(pem_file: &Path) -> CertificateDer<'static> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    CertificateDer::pem_file_iter(pem_file)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
}
