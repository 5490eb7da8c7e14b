//! The idgen-client crate over TLS: calls to TLS nodes, client
//! certificates for nodes that require them, the server-name override,
//! and clear failures when one side speaks TLS and the other does not.

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
