//! TLS for the CLI's gRPC connections: `https://` addresses, `--ca`,
//! `--cert`, `--key` and `--tls-server-name` as the client crate's TLS
//! settings (its connector dials, its PEM reader reads the files, its
//! words say what went wrong, naming these flags: [`REMEDIES`]); and
//! `idgen tls dev-certs`, a development PKI in one step.

use std::io;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use idgen_client::{TlsConfig, TlsRemedies, TlsUse};
use rustls_pki_types::ServerName;

use super::args::{DevCertsArgs, TlsArgs};

/// The flags the client crate's words of a TLS refusal name here.
pub const REMEDIES: TlsRemedies = TlsRemedies {
    ca: "--ca",
    server_name: "--tls-server-name",
    identity: "--cert and --key",
    add_identity: "pass --cert and --key, a certificate signed by the node's server.tls.client_ca (idgen tls dev-certs makes one)",
    use_tls: "use an https:// address with --ca",
    use_plaintext: "use an http:// address",
};

impl TlsArgs {
    /// The idgen-client TLS settings of these options, files read and
    /// checked: `None` without `--ca` (plaintext), an error for `--cert`
    /// or `--tls-server-name` without `--ca`.
    pub fn client_tls(&self) -> anyhow::Result<Option<TlsConfig>> {
        let Some(ca) = &self.ca else {
            if self.any() {
                bail!("--cert, --key and --tls-server-name need --ca: the CA certificate (PEM) that signed the nodes' certificates");
            }
            return Ok(None);
        };
        let mut tls = TlsConfig::from_ca_file(ca).map_err(|e| flag_error("--ca", e))?;
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls
                .identity_files(cert, key)
                .map_err(|e| flag_error("--cert and --key", e))?;
        }
        if let Some(name) = &self.server_name {
            check_server_name(name)?;
            tls = tls.server_name(name.trim());
        }
        Ok(Some(tls))
    }

    /// How a channel dialled with these options speaks TLS, for the words
    /// of a failed call.
    pub fn tls_use(&self) -> TlsUse {
        TlsUse::Tls {
            identity: self.cert.is_some(),
        }
    }

    /// Whether any TLS option was given.
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.server_name.is_some()
    }
}

/// The client crate's refusal of a file, naming the flag that gave it.
fn flag_error(flag: &str, e: idgen_client::Error) -> anyhow::Error {
    match e {
        idgen_client::Error::Config(problem) => anyhow!("{flag}: {problem}"),
        other => anyhow!("{flag}: {other}"),
    }
}

/// `--tls-server-name` as rustls takes it, or an error naming the flag.
fn check_server_name(name: &str) -> anyhow::Result<()> {
    ServerName::try_from(name.trim().to_owned()).map_err(|e| {
        anyhow!("--tls-server-name {name:?} is not a DNS name or IP address ({e}): give the name the nodes' certificates carry, e.g. idgen.internal")
    })?;
    Ok(())
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
