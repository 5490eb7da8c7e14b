//! TLS for the CLI's gRPC connections: `https://` addresses, `--ca`,
//! `--cert`, `--key`, and telling which side speaks what when a plaintext
//! client meets a TLS node or the other way round; and `idgen tls
//! dev-certs`, a development PKI in one step.

use std::io;
use std::net::{TcpStream as StdTcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

use super::args::{DevCertsArgs, TlsArgs};

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
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    anyhow!(
                        "--cert and --key cannot be used: {}",
                        idgen::server::tls::certificate_problem(&e)
                    )
                })?
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
        let cause = super::output::root_cause(&e);
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

/// A failed call's TLS cause in words that say what to do, when the node
/// refused this client's certificate or wanted one (TLS 1.3 tells the
/// client only after the handshake, so the call fails, not the connect).
/// `without_cert`: the call went over TLS without `--cert`, so a
/// connection closed right after the handshake is most likely a node that
/// requires one (the alert can lose the race with the request).
pub fn refused_identity(status: &tonic::Status, without_cert: bool) -> Option<String> {
    let mut cause = String::new();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        cause.push_str(&format!(" {e:?} {e}"));
        source = e.source();
    }
    let has = |w: &str| cause.contains(w);
    if has("CertificateRequired") {
        return Some("the node requires a client certificate: pass --cert and --key, a certificate signed by the node's server.tls.client_ca (idgen tls dev-certs makes one)".into());
    }
    // hyper reports a connection that closed under a call in flight as
    // CANCELLED "operation was canceled", sometimes with no source at all.
    let closed = ["connection closed", "BrokenPipe", "ConnectionReset"];
    let canceled = status.code() == tonic::Code::Cancelled
        || status.message().contains("operation was canceled");
    if without_cert && (canceled || closed.iter().any(|w| has(w))) {
        return Some(format!("the connection closed right after the TLS handshake ({}): if the node requires a client certificate (server.tls.client_required), pass --cert and --key", super::output::root_cause(status)));
    }
    let refused = [
        "BadCertificate",
        "UnknownCA",
        "CertificateUnknown",
        "UnsupportedCertificate",
        "CertificateExpired",
        "CertificateRevoked",
        "AccessDenied",
    ];
    refused.iter().any(|w| has(w)).then(|| {
        "the node refused the client certificate (--cert): it must be signed by the node's server.tls.client_ca, unexpired, X.509 v3 with clientAuth usage".into()
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

/// The files `idgen tls dev-certs` writes for one certificate.
struct Issued {
    /// `node`, `client` or a --clients name: NAME.pem and NAME-key.pem.
    name: String,
    cert: String,
    key: String,
}

/// `idgen tls dev-certs`: a CA, a node certificate and client
/// certificates, X.509 v3 with the right extended key usages, written to
/// `args.dir`; prints what to put in the config and on client command
/// lines. Checks every name and every file before it writes any.
pub fn dev_certs(args: &DevCertsArgs) -> anyhow::Result<()> {
    let mut clients = vec!["client".to_owned()];
    for name in &args.clients {
        check_client_name(name)?;
        if clients.contains(name) {
            bail!("--clients {name:?} is given twice (or is the default client): name each client once");
        }
        clients.push(name.clone());
    }
    let mut node_names = vec!["localhost".to_owned(), "127.0.0.1".into(), "::1".into()];
    for host in args
        .hosts
        .iter()
        .map(|h| h.trim())
        .filter(|h| !h.is_empty())
    {
        if !node_names.iter().any(|n| n == host) {
            node_names.push(host.to_owned());
        }
    }
    let mut names = vec!["ca".to_owned(), "node".to_owned()];
    names.extend(clients.iter().cloned());
    let files: Vec<PathBuf> = names
        .iter()
        .flat_map(|n| [format!("{n}.pem"), format!("{n}-key.pem")])
        .map(|f| args.dir.join(f))
        .collect();
    if !args.force {
        if let Some(existing) = files.iter().find(|f| f.exists()) {
            bail!(
                "{} exists: refusing to overwrite it (the certificates in {} may be in use); pass --force to replace every file, or choose another directory",
                existing.display(),
                args.dir.display()
            );
        }
    }
    let (validity, not_after) = validity(args.days)?;
    let (ca, issuer) = make_ca(&validity)?;
    let node = make_leaf("node", &node_names, Leaf::Server, &validity, &issuer)?;
    let mut issued = vec![ca, node];
    for name in &clients {
        issued.push(make_leaf(
            name,
            std::slice::from_ref(name),
            Leaf::Client,
            &validity,
            &issuer,
        )?);
    }
    create_dir(&args.dir)?;
    for i in &issued {
        write_file(
            &args.dir.join(format!("{}.pem", i.name)),
            &i.cert,
            0o644,
            args.force,
        )?;
        write_file(
            &args.dir.join(format!("{}-key.pem", i.name)),
            &i.key,
            0o600,
            args.force,
        )?;
    }
    print!(
        "{}",
        dev_certs_usage(&args.dir, &node_names, &clients, &not_after)
    );
    Ok(())
}

/// What a certificate is for: its extended key usage.
#[derive(Clone, Copy)]
enum Leaf {
    Server,
    Client,
}

/// Empty certificate parameters but for the validity: not-before
/// yesterday (for clocks a little behind), not-after `days` from today,
/// both at midnight UTC; and the not-after date in words.
fn validity(days: u32) -> anyhow::Result<(rcgen::CertificateParams, String)> {
    let day = |offset: i64| -> anyhow::Result<jiff::civil::Date> {
        let t = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::from_hours(24 * offset))
            .map_err(|e| anyhow!("--days {days}: the date is out of range: {e}"))?;
        Ok(jiff::tz::Offset::UTC.to_datetime(t).date())
    };
    let ymd = |d: jiff::civil::Date| -> anyhow::Result<rcgen::CertificateParams> {
        let month = u8::try_from(d.month()).context("month")?;
        let day = u8::try_from(d.day()).context("day")?;
        let mut p = rcgen::CertificateParams::default();
        p.not_before = rcgen::date_time_ymd(i32::from(d.year()), month, day);
        Ok(p)
    };
    let (from, to) = (day(-1)?, day(i64::from(days))?);
    let mut params = ymd(from)?;
    params.not_after = ymd(to)?.not_before;
    params.distinguished_name = rcgen::DistinguishedName::new();
    Ok((params, format!("{to} 00:00 UTC")))
}

/// The development CA: may sign leaves only (path length 0).
fn make_ca(
    validity: &rcgen::CertificateParams,
) -> anyhow::Result<(Issued, rcgen::Issuer<'static, rcgen::KeyPair>)> {
    let mut params = validity.clone();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "idgen development CA");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let key = rcgen::KeyPair::generate().context("cannot generate the CA key")?;
    let cert = params
        .self_signed(&key)
        .context("cannot sign the CA certificate")?;
    let issued = Issued {
        name: "ca".into(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    };
    Ok((issued, rcgen::Issuer::new(params, key)))
}

/// A node or client certificate for `sans` (IP addresses or DNS names),
/// subject CN `name`, signed by `issuer`.
fn make_leaf(
    name: &str,
    sans: &[String],
    leaf: Leaf,
    validity: &rcgen::CertificateParams,
    issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
) -> anyhow::Result<Issued> {
    let mut params = rcgen::CertificateParams::new(sans.to_vec()).map_err(|e| {
        anyhow!("{name}: {sans:?} holds a name that is neither a DNS name nor an IP address: {e}")
    })?;
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let cn = if name == "node" { "idgen node" } else { name };
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![match leaf {
        Leaf::Server => rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        Leaf::Client => rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    }];
    params.use_authority_key_identifier_extension = true;
    let key =
        rcgen::KeyPair::generate().with_context(|| format!("cannot generate the {name} key"))?;
    let cert = params
        .signed_by(&key, issuer)
        .with_context(|| format!("cannot sign the {name} certificate"))?;
    Ok(Issued {
        name: name.to_owned(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A --clients name: it becomes a file name and a subject CN.
fn check_client_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !ok || name == "ca" || name == "node" {
        bail!("--clients {name:?}: use 1 to 64 letters, digits, '.', '_' or '-' (not starting with '.'), other than \"ca\" and \"node\": the name becomes NAME.pem and the certificate's CN");
    }
    Ok(())
}

fn create_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

/// Writes `text` to a new file `path` with `mode` (a key: 0600, whatever
/// the umask); without `force`, refuses a file that appeared since the
/// check. With `force` an existing entry is removed first, never written
/// through: a symbolic link there is replaced, its target left alone, and
/// a key never inherits an old file's wider mode.
fn write_file(path: &Path, text: &str, mode: u32, force: bool) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if force {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot replace {}", path.display()))
            }
            _ => {}
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // The umask may have taken bits off a certificate's 0644: set it.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| file.write_all(text.as_bytes()))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The config lines and client flags for the files in `dir`.
fn dev_certs_usage(
    dir: &Path,
    node_names: &[String],
    clients: &[String],
    not_after: &str,
) -> String {
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let f = |name: &str| abs.join(name).display().to_string();
    let admins: Vec<String> = clients.iter().skip(1).map(|c| format!("{c:?}")).collect();
    let admin_names = if admins.is_empty() {
        "# client_cert_names = [\"admin\"]   # run with --clients admin for an admin certificate"
            .to_owned()
    } else {
        format!("client_cert_names = [{}]", admins.join(", "))
    };
    format!(
        r#"Wrote a development CA, a node certificate ({names}) and client certificates ({clients}) to {dir}, valid until {not_after}.
Keys are 0600; keep ca-key.pem away from the nodes. For development and tests only.

# Node config (idgen.toml):
[server.tls]
cert = "{node}"
key = "{node_key}"
# Clients must present a certificate signed by this CA (mTLS).
client_ca = "{ca}"
client_required = true

[admin]
{admin_names}
# Admin calls only from these networks (loopback here; add your admin hosts).
allow = ["127.0.0.0/8", "::1/128"]

# Client flags (idgen gen / admin / state backup / bench):
  --addr https://localhost:50051 --ca {ca} --cert {client} --key {client_key}
# Rust client: idgen_client::TlsConfig::from_ca_file("{ca}")?.identity_files("{client}", "{client_key}")?
"#,
        names = node_names.join(", "),
        clients = clients.join(", "),
        dir = abs.display(),
        node = f("node.pem"),
        node_key = f("node-key.pem"),
        ca = f("ca.pem"),
        client = f("client.pem"),
        client_key = f("client-key.pem"),
    )
}

#[cfg(test)]
mod tests {
    use super::refused_identity;

    #[test]
    fn a_call_canceled_by_the_closing_connection_names_the_missing_certificate() {
        // What hyper reports when the node's CertificateRequired alert
        // closes the connection under the call: no source to read.
        let canceled = tonic::Status::cancelled("operation was canceled");
        let words = refused_identity(&canceled, true).unwrap_or_default();
        assert!(words.contains("--cert"), "{words}");
        assert_eq!(refused_identity(&canceled, false), None);
    }
}
