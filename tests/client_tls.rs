//! The idgen-client crate over TLS: calls to TLS nodes, client
//! certificates for nodes that require them, the server-name override,
//! and clear failures when one side speaks TLS and the other does not, or
//! the address is the node's HTTP/1.1 port.

mod common;

use std::time::Duration;

use common::tls::server_cert;
use common::{test_config, TestServer};
use idgen::config::TlsSettings;
use idgen_client::{Client, Error, Mode, TlsConfig};

fn tls_node_config(
    dir: &std::path::Path,
    cert: &common::tls::ServerCert,
    client_ca: Option<std::path::PathBuf>,
) -> idgen::config::Config {
    let mut config = test_config(dir);
    config.server.tls = Some(TlsSettings {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        client_required: client_ca.is_some(),
        client_ca,
    });
    config
}

async fn client(addr: std::net::SocketAddr, tls: Option<TlsConfig>) -> Client {
    let mut b = Client::builder()
        .endpoints([addr.to_string()])
        .deadline(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(2));
    if let Some(tls) = tls {
        b = b.tls(tls);
    }
    b.build().await.expect("client builds")
}

/// Pointed at the node's HTTP port, the client's error names it (an
/// HTTP/1.1 port, use the gRPC one) and what was tried, instead of
/// "the connection broke; the node may speak TLS".
#[tokio::test]
async fn the_client_names_the_http_port_and_what_it_tried() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestServer::start(test_config(dir.path())).await;
    let err = client(node.http, None)
        .await
        .gen_id(Mode::Snowflake, "")
        .await
        .expect_err("gRPC to the HTTP port fails");
    let text = err.to_string();
    assert!(
        text.contains("speaks HTTP/1.1, not gRPC") && text.contains("server.grpc_listen"),
        "the error names the HTTP port: {text}"
    );
    assert!(!text.contains("may speak TLS"), "{text}");
    let Error::DeadlineExceeded {
        attempts, nodes, ..
    } = err
    else {
        panic!("every attempt failed until the deadline: {text}");
    };
    assert_eq!(nodes, 1, "{text}");
    assert!(
        text.contains(&format!("after {attempts} attempt")) && text.contains("on 1 node"),
        "{text}"
    );
    node.stop().await;
}

/// 200 IDs, strictly increasing from one node.
async fn ids_increase(c: &Client) {
    let mut last = 0;
    for _ in 0..200 {
        let id = c.gen_id(Mode::Snowflake, "").await.expect("GenId over TLS");
        assert!(id > last, "IDs from one node increase: {id} after {last}");
        last = id;
    }
}

#[tokio::test]
async fn the_client_calls_tls_nodes_and_names_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let cert = server_cert(dir.path(), "server");
    let tls_node = TestServer::start(tls_node_config(dir.path(), &cert, None)).await;
    let plain_dir = tempfile::tempdir().unwrap();
    let plain_node = TestServer::start(test_config(plain_dir.path())).await;

    let ca = TlsConfig::from_ca_file(&cert.cert).expect("CA file");
    ids_increase(&client(tls_node.grpc, Some(ca.clone())).await).await;

    // Plaintext client, TLS node.
    let err = client(tls_node.grpc, None)
        .await
        .gen_id(Mode::Snowflake, "")
        .await
        .expect_err("plaintext to a TLS node fails");
    assert!(
        matches!(err, Error::DeadlineExceeded { .. }),
        "the node is unreachable, not wrong: {err}"
    );
    assert!(
        err.to_string().contains("may speak TLS"),
        "the error hints at TLS: {err}"
    );

    // TLS client, plaintext node.
    let err = client(plain_node.grpc, Some(ca.clone()))
        .await
        .gen_id(Mode::Snowflake, "")
        .await
        .expect_err("TLS to a plaintext node fails");
    assert!(
        err.to_string().contains("does not speak TLS"),
        "the error says the node is plaintext: {err}"
    );

    // A CA that did not sign the node's certificate.
    let other = server_cert(dir.path(), "other");
    let err = client(
        tls_node.grpc,
        Some(TlsConfig::from_ca_file(&other.cert).unwrap()),
    )
    .await
    .gen_id(Mode::Snowflake, "")
    .await
    .expect_err("an untrusted node certificate fails");
    assert!(
        err.to_string().contains("not trusted"),
        "the error says the certificate is not trusted: {err}"
    );
    tls_node.stop().await;
    plain_node.stop().await;
}

#[tokio::test]
async fn a_node_that_requires_client_certificates_serves_only_clients_that_have_one() {
    let dir = tempfile::tempdir().unwrap();
    let cert = server_cert(dir.path(), "server");
    let client_cert = server_cert(dir.path(), "client");
    let node = TestServer::start(tls_node_config(
        dir.path(),
        &cert,
        Some(client_cert.cert.clone()),
    ))
    .await;
    let ca = TlsConfig::from_ca_file(&cert.cert).unwrap();

    let with = ca
        .clone()
        .identity_files(&client_cert.cert, &client_cert.key)
        .expect("identity files");
    ids_increase(&client(node.grpc, Some(with)).await).await;

    let without = client(node.grpc, Some(ca)).await;
    assert!(
        without.gen_id(Mode::Snowflake, "").await.is_err(),
        "no client certificate, no ID"
    );
    node.stop().await;
}

#[tokio::test]
async fn the_server_name_override_checks_certificates_that_name_a_host() {
    let dir = tempfile::tempdir().unwrap();
    // A certificate for a name only: the node is dialled by IP address.
    let cert = common::tls::self_signed_cert(dir.path(), "named", &["idgen.test"]);
    let node = TestServer::start(tls_node_config(dir.path(), &cert, None)).await;
    let ca = TlsConfig::from_ca_file(&cert.cert).unwrap();

    let by_ip = client(node.grpc, Some(ca.clone())).await;
    assert!(
        by_ip.gen_id(Mode::Snowflake, "").await.is_err(),
        "127.0.0.1 is not in the certificate"
    );
    ids_increase(&client(node.grpc, Some(ca.server_name("idgen.test"))).await).await;
    node.stop().await;
}

#[tokio::test]
async fn bad_tls_files_are_refused_when_the_client_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let missing = TlsConfig::from_ca_file(dir.path().join("nope.pem")).unwrap_err();
    assert!(missing.to_string().contains("nope.pem"), "{missing}");
    let cert = server_cert(dir.path(), "server");
    let err = Client::builder()
        .endpoints(["127.0.0.1:1"])
        .tls(
            TlsConfig::from_ca_file(&cert.cert)
                .unwrap()
                .identity("junk", "junk"),
        )
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("client certificate"), "{err}");
}

#[tokio::test]
async fn idgen_bench_runs_its_load_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let cert = server_cert(dir.path(), "server");
    let node = TestServer::start(tls_node_config(dir.path(), &cert, None)).await;
    let run = |addr: String, ca: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(common::idgen_bin());
        cmd.args([
            "bench",
            "--addr",
            &addr,
            "--duration",
            "300ms",
            "--warmup",
            "0s",
        ])
        .args(["--concurrency", "4", "--json"]);
        if let Some(ca) = ca {
            cmd.arg("--ca").arg(ca);
        }
        cmd.output().expect("idgen bench runs")
    };
    let out = tokio::task::spawn_blocking({
        let (addr, ca) = (
            format!("https://localhost:{}", node.grpc.port()),
            cert.cert.clone(),
        );
        move || run(addr, Some(&ca))
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "bench over TLS: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let first = &report[0];
    assert!(
        first["calls"].as_u64().unwrap_or(0) > 0,
        "calls were made: {first}"
    );
    assert_eq!(first["errors"].as_u64(), Some(0), "no call failed: {first}");

    // Plaintext bench against the TLS port fails and says why.
    let out = tokio::task::spawn_blocking({
        let addr = format!("http://localhost:{}", node.grpc.port());
        move || run(addr, None)
    })
    .await
    .unwrap();
    assert!(!out.status.success(), "plaintext bench against TLS fails");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("speaks TLS"), "and says why: {stderr}");
    node.stop().await;
}

/// `idgen tls dev-certs DIR`, then the config lines it prints, as printed.
fn dev_certs(dir: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let pki = dir.join("pki");
    let mut args = vec!["tls", "dev-certs", pki.to_str().unwrap()];
    args.extend_from_slice(extra);
    common::run_idgen(&args)
}

/// The node config `idgen tls dev-certs` printed (from `[server.tls]` to
/// the client flags).
fn printed_config(out: &str) -> String {
    let start = out.find("[server.tls]").expect("[server.tls] printed");
    let end = out.find("# Client flags").expect("client flags printed");
    out[start..end].to_owned()
}

/// `--force` replaces what is there instead of writing through it: a
/// symbolic link where a key goes is replaced by a 0600 file, and the file
/// it pointed to is left as it was.
#[test]
fn dev_certs_force_replaces_a_symbolic_link_and_leaves_its_target_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let elsewhere = dir.path().join("elsewhere.txt");
    std::fs::write(&elsewhere, "not a key\n").unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, pki.join("ca-key.pem")).unwrap();
    let (ok, out) = dev_certs(dir.path(), &["--force"]);
    assert!(ok, "{out}");
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "not a key\n");
    let mode = std::fs::metadata(&elsewhere).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "the link's target keeps its mode");
    let key = std::fs::symlink_metadata(pki.join("ca-key.pem")).unwrap();
    assert!(key.file_type().is_file(), "the link was replaced by a file");
    assert_eq!(key.permissions().mode() & 0o777, 0o600);
}

/// The dev-certs output, used as printed, makes a working mTLS setup: a
/// node that requires client certificates, a Rust client and the CLI with
/// the client certificate get IDs, and without one they are told what is
/// missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_certs_output_serves_mtls_end_to_end() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = dev_certs(dir.path(), &["--clients", "admin", "--hosts", "idgen.test"]);
    assert!(ok, "{out}");
    let pki = dir.path().join("pki");
    for name in ["ca", "node", "client", "admin"] {
        let key = pki.join(format!("{name}-key.pem"));
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
        assert!(pki.join(format!("{name}.pem")).exists());
    }
    assert!(out.contains("client_cert_names = [\"admin\"]"), "{out}");
    assert!(out.contains("--cert") && out.contains("--key"), "{out}");

    // Nothing is overwritten without --force; with it, everything is.
    let before = std::fs::read(pki.join("ca.pem")).unwrap();
    let (ok, again) = dev_certs(dir.path(), &[]);
    assert!(
        !ok && again.contains("exists") && again.contains("--force"),
        "{again}"
    );
    assert_eq!(std::fs::read(pki.join("ca.pem")).unwrap(), before);
    let (ok, out) = dev_certs(dir.path(), &["--force"]);
    assert!(ok, "{out}");
    assert_ne!(std::fs::read(pki.join("ca.pem")).unwrap(), before);

    let config = common::write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&printed_config(&out));
    std::fs::write(&config, text).unwrap();
    let node = common::ChildServer::start(&config);

    let ca = TlsConfig::from_ca_file(pki.join("ca.pem")).unwrap();
    let with = ca
        .clone()
        .identity_files(pki.join("client.pem"), pki.join("client-key.pem"))
        .unwrap();
    ids_increase(&client(node.grpc, Some(with)).await).await;
    let err = client(node.grpc, Some(ca))
        .await
        .gen_id(Mode::Snowflake, "")
        .await
        .expect_err("no client certificate, no ID");
    let text = err.to_string();
    // The alert itself, or (when the call raced it) the connection closing
    // right after the handshake: either way the missing certificate is named.
    assert!(
        text.contains("client certificate") && text.contains("identity"),
        "the error names the missing client certificate: {text}"
    );
    assert!(!text.contains("may speak TLS"), "TLS is set: {text}");

    let addr = format!("https://localhost:{}", node.grpc.port());
    let file = |n: &str| pki.join(n).to_str().unwrap().to_owned();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client-key.pem"));
    let run = |extra: Vec<String>| {
        let mut a: Vec<String> = ["gen", "--addr", &addr, "--ca", &ca, "-n", "3"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        a.extend(extra);
        tokio::task::spawn_blocking(move || {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            common::run_idgen(&a)
        })
    };
    let (ok, out) = run(vec!["--cert".into(), cert, "--key".into(), key])
        .await
        .unwrap();
    assert!(ok, "{out}");
    assert_eq!(out.lines().count(), 3, "{out}");
    let (ok, out) = run(vec![]).await.unwrap();
    assert!(!ok, "{out}");
    assert!(
        out.contains("client certificate") && out.contains("--cert"),
        "the CLI names the missing client certificate: {out}"
    );
    assert!(!out.contains("transport error"), "{out}");
}

/// A v1 certificate (openssl `x509 -req` without `-extfile`; the fixture in
/// tests/fixtures/tls-v1 was made so) is named as such by the node, the CLI
/// and the client crate, never as a key that does not fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_certificate_is_named_as_such_everywhere() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls-v1");
    let (ca, cert, key) = (
        fixtures.join("ca.pem"),
        fixtures.join("v1.pem"),
        fixtures.join("v1-key.pem"),
    );
    const V1: &str = "the certificate is X.509 v1; re-issue it as v3 (openssl: add -extfile with basicConstraints/subjectAltName, or use idgen tls dev-certs)";

    let err = idgen::server::tls::Identity::load(&TlsSettings {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: None,
        client_required: false,
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains(V1), "node: {err}");
    assert!(
        !err.contains("does not fit") && !err.contains("not the key"),
        "node: {err}"
    );

    let (ok, out) = tokio::task::spawn_blocking(move || {
        common::run_idgen(&[
            "gen",
            "--addr",
            "https://localhost:1",
            "--ca",
            ca.to_str().unwrap(),
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ])
    })
    .await
    .unwrap();
    assert!(!ok, "{out}");
    assert!(out.contains(V1), "CLI: {out}");
    assert!(!out.contains("do not fit"), "CLI: {out}");

    let err = Client::builder()
        .endpoints(["127.0.0.1:1"])
        .tls(
            TlsConfig::from_ca_file(fixtures.join("ca.pem"))
                .unwrap()
                .identity_files(fixtures.join("v1.pem"), fixtures.join("v1-key.pem"))
                .unwrap(),
        )
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(V1), "client crate: {err}");
}

/// A file that holds no certificate is refused in the same words by the
/// node (`server.tls.cert`, `server.tls.client_ca`, `consul.ca_file`), the
/// client crate (a nodes' CA, a Consul CA) and the CLI (`--ca`), each
/// naming the file: one PEM reader for every TLS file.
#[test]
fn a_file_without_a_certificate_is_refused_in_the_same_words_everywhere() {
    const NO_CERT: &str =
        "holds no PEM CERTIFICATE block; give the certificate(s) in PEM, a chain leaf first";
    let dir = tempfile::tempdir().unwrap();
    let cert = server_cert(dir.path(), "server");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let node = |cert_file: &std::path::Path, client_ca: Option<&std::path::Path>| {
        idgen::server::tls::Identity::load(&TlsSettings {
            cert: cert_file.to_owned(),
            key: cert.key.clone(),
            client_ca: client_ca.map(std::path::Path::to_owned),
            client_required: false,
        })
        .unwrap_err()
        .to_string()
    };
    let consul = idgen::consul::ConsulTlsFiles {
        ca_file: junk.clone(),
        ..Default::default()
    };
    let junk_arg = junk.to_str().unwrap();
    let said = [
        ("node server.tls.cert", node(&junk, None)),
        ("node server.tls.client_ca", node(&cert.cert, Some(&junk))),
        (
            "node consul.ca_file",
            idgen::consul::ConsulTls::load(&consul)
                .unwrap_err()
                .to_string(),
        ),
        (
            "client crate CA",
            TlsConfig::from_ca_file(&junk).unwrap_err().to_string(),
        ),
        (
            "client crate Consul CA",
            idgen_client::ConsulTls::from_files(&junk, None, None).unwrap_err(),
        ),
        (
            "CLI --ca",
            common::run_idgen(&["gen", "--addr", "https://localhost:1", "--ca", junk_arg]).1,
        ),
    ];
    for (who, text) in said {
        assert!(
            text.contains(NO_CERT) && text.contains(junk_arg),
            "{who}: {text}"
        );
    }
}

/// A client certificate the node refuses (here: none sent to a node with
/// `client_required`) is a WARN naming the peer and the cause, and a burst
/// of them writes far fewer lines than refusals (rate-limited per port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_certificate_is_a_rate_limited_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = dev_certs(dir.path(), &[]);
    assert!(ok, "{out}");
    let config = common::write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&printed_config(&out));
    std::fs::write(&config, text).unwrap();
    let node = common::ChildServer::start(&config);
    let ca = TlsConfig::from_ca_file(dir.path().join("pki/ca.pem")).unwrap();

    const REFUSALS: usize = 5;
    for _ in 0..REFUSALS {
        let c = client(node.grpc, Some(ca.clone())).await;
        c.gen_id(Mode::Snowflake, "")
            .await
            .expect_err("no client certificate, no ID");
    }
    let warned = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("WARN") && l.contains("refused a client certificate"))
            .map(str::to_owned)
            .collect()
    };
    // The log line is written as the handshake fails: wait for it (bounded).
    let mut lines = Vec::new();
    for _ in 0..100 {
        lines = warned(&node.log_text());
        if !lines.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !lines.is_empty(),
        "no WARN for the refused certificate:\n{}",
        node.log_text()
    );
    assert!(
        lines[0].contains("127.0.0.1:") && lines[0].contains("no certificate"),
        "the peer and the cause: {}",
        lines[0]
    );
    assert!(
        lines.len() < REFUSALS,
        "{} WARN lines for {REFUSALS} refusals: not rate-limited",
        lines.len()
    );
}
