//! Consul over HTTPS: nodes that reach the agent with a CA and a client
//! certificate (the agent has `verify_incoming`), serve TLS themselves and
//! are probed by the agent's gRPC check over TLS; the refusals that must
//! stop a node with a clear error; the http/https mismatch both ways; and
//! the idgen-client crate discovering the nodes over HTTPS. Every
//! certificate is made here (rcgen).

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::tls::{ca, der_of, grpc_client, leaf_cert, Ca};
use common::{write_cluster_config, ChildServer};
use consul_testserver::{CheckTlsConfig, HealthStatus, HttpsConfig, TestConsul};
use idgen::consul::{Consistency, ConsulClient, ConsulConfig, ConsulTls, ConsulTlsFiles};
use idgen::proto::{GenIdsRequest, Mode};

/// The certificates of one test: a CA for Consul (its HTTPS certificate
/// and the clients it accepts), a CA for idgen's own ports.
struct Pki {
    consul_ca: Ca,
    consul_cert: (PathBuf, PathBuf),
    node_client: (PathBuf, PathBuf),
    idgen_ca: Ca,
    node_cert: (PathBuf, PathBuf),
}

fn pki(dir: &Path) -> Pki {
    let consul_ca = ca(dir, "consul");
    let idgen_ca = ca(dir, "idgen");
    Pki {
        // Like Consul's own `consul tls cert create -server`: the name
        // server.dc1.consul and localhost, no IP, so a client dialling
        // 127.0.0.1 must name the server (consul.tls_server_name).
        consul_cert: leaf_cert(
            dir,
            &consul_ca,
            "consul-agent",
            &["server.dc1.consul", "localhost"],
        ),
        node_client: leaf_cert(dir, &consul_ca, "idgen-node", &["idgen-node"]),
        // The nodes' certificate carries no IP: the gRPC check must verify
        // the name idgen registers as TLSServerName (its first DNS name).
        node_cert: leaf_cert(
            dir,
            &idgen_ca,
            "idgen-server",
            &["idgen.internal", "localhost"],
        ),
        consul_ca,
        idgen_ca,
    }
}

fn pem(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// The Consul test server with HTTPS, `verify_incoming` (clients need a
/// certificate from the Consul CA), and gRPC checks that trust idgen's CA
/// and present the agent's certificate.
async fn https_consul(p: &Pki) -> TestConsul {
    common::consul::start(consul_testserver::Config {
        https: Some(HttpsConfig {
            cert_pem: pem(&p.consul_cert.0),
            key_pem: pem(&p.consul_cert.1),
            client_ca_pem: Some(pem(&p.consul_ca.cert)),
        }),
        check_tls: CheckTlsConfig {
            ca_pem: Some(pem(&p.idgen_ca.cert)),
            client_pem: Some((pem(&p.consul_cert.0), pem(&p.consul_cert.1))),
        },
        ..common::consul::cluster_settings()
    })
    .await
}

fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// A node config: HTTPS to the agent at `agent` with `ca_file` (and the
/// client certificate unless `client_cert` is false), TLS on its own
/// ports, plus `extra`.
fn node_config(
    dir: &Path,
    name: &str,
    agent: SocketAddr,
    p: &Pki,
    ca_file: &Path,
    extra: &[(&str, &str, &str)],
) -> PathBuf {
    let address = format!("\"https://{agent}\"");
    let (ca, cert, key) = (
        toml_path(ca_file),
        toml_path(&p.node_client.0),
        toml_path(&p.node_client.1),
    );
    let (server_cert, server_key) = (toml_path(&p.node_cert.0), toml_path(&p.node_cert.1));
    let mut set: Vec<(&str, &str, &str)> = vec![
        ("consul", "address", &address),
        ("consul", "ca_file", &ca),
        ("consul", "cert_file", &cert),
        ("consul", "key_file", &key),
        ("consul", "tls_server_name", "\"server.dc1.consul\""),
        ("server.tls", "cert", &server_cert),
        ("server.tls", "key", &server_key),
    ];
    set.extend_from_slice(extra);
    write_cluster_config(dir, name, agent, &set)
}

/// An in-process Consul client to `agent` over HTTPS with the node's
/// client certificate.
fn https_client(agent: SocketAddr, p: &Pki) -> ConsulClient {
    let tls = ConsulTls::load(&ConsulTlsFiles {
        ca_file: p.consul_ca.cert.clone(),
        cert_file: Some(p.node_client.0.clone()),
        key_file: Some(p.node_client.1.clone()),
        server_name: Some("server.dc1.consul".into()),
    })
    .expect("consul TLS files");
    ConsulClient::new(ConsulConfig {
        address: format!("https://{agent}"),
        tls: Some(tls),
        ..ConsulConfig::default()
    })
    .expect("https client")
}

/// Polls `check` every 100 ms for up to `limit`.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tls_nodes_use_consul_over_mtls_and_pass_the_agents_grpc_check_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let consul = https_consul(&p).await;
    let mut agents = Vec::new();
    for i in 1..=3 {
        agents.push(consul.add_agent(&format!("agent-{i}")).await.unwrap());
    }
    let nodes: Vec<ChildServer> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let name = format!("n{i}");
            ChildServer::start(&node_config(
                dir.path(),
                &name,
                *a,
                &p,
                &p.consul_ca.cert,
                &[],
            ))
        })
        .collect();

    // Each node issues over TLS, from its own worker id; no duplicates.
    let root = der_of(&p.idgen_ca.cert);
    let mut all = HashSet::new();
    let mut workers = HashSet::new();
    for n in &nodes {
        let mut c = grpc_client(n.grpc, &root).await.expect("TLS gRPC");
        let ids = c
            .gen_ids(GenIdsRequest {
                mode: Mode::Snowflake as i32,
                tag: String::new(),
                count: 500,
            })
            .await
            .expect("issues over TLS")
            .into_inner()
            .ids;
        let layout = common::default_layout();
        workers.extend(
            ids.iter()
                .map(|id| layout.decompose(*id).expect("decodes").worker),
        );
        all.extend(ids);
    }
    assert_eq!(all.len(), 1500, "no duplicate across the three nodes");
    assert_eq!(workers.len(), 3, "three worker ids: {workers:?}");

    // The agents probe each node over TLS, verifying the name idgen
    // registered, and the health API (over HTTPS, mTLS) lists all three
    // as passing.
    let client = https_client(consul.addr(), &p);
    let passing = eventually(Duration::from_secs(20), || async {
        client
            .health_service("idgen", true)
            .await
            .is_ok_and(|e| e.len() == 3)
    })
    .await;
    assert!(passing, "three passing instances: {:#?}", consul.services());
    for s in consul.services() {
        assert_eq!(s.status, HealthStatus::Passing, "{s:?}");
        let check = &s.checks[0];
        assert!(check.output.contains("success"), "{check:?}");
    }
    // What was registered: GRPCUseTLS with the certificate's DNS name,
    // never TLSSkipVerify.
    let raw = agent_checks(&consul, agents[0], &p).await;
    let check = raw
        .as_object()
        .and_then(|o| o.values().next())
        .cloned()
        .expect("one check on agent-1");
    assert_eq!(check["GRPCUseTLS"], true, "{check}");
    assert_eq!(check["TLSServerName"], "idgen.internal", "{check}");
    assert_eq!(check["TLSSkipVerify"], false, "{check}");

    // The idgen-client crate finds the same nodes through Consul over
    // HTTPS (address host verified, client certificate presented).
    let discovery =
        idgen_client::ConsulDiscovery::new(format!("https://localhost:{}", consul.addr().port()))
            .tls(
                idgen_client::ConsulTls::from_files(
                    &p.consul_ca.cert,
                    Some((&p.node_client.0, &p.node_client.1)),
                    None,
                )
                .expect("client TLS files"),
            );
    // The nodes are dialled over TLS too: their certificate names
    // idgen.internal, discovery gives IP addresses.
    let node_tls = idgen_client::TlsConfig::from_ca_file(&p.idgen_ca.cert)
        .expect("idgen CA")
        .server_name("idgen.internal");
    let found = idgen_client::Client::builder()
        .consul(discovery)
        .tls(node_tls)
        .build()
        .await
        .expect("discovers over HTTPS");
    let mut want: Vec<String> = nodes.iter().map(|n| n.grpc.to_string()).collect();
    let mut got = found.nodes();
    want.sort();
    got.sort();
    assert_eq!(got, want, "the client crate sees the three nodes");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..300 {
        let id = found
            .gen_id(idgen_client::Mode::Snowflake, "")
            .await
            .expect("GenId over TLS through Consul over HTTPS");
        assert!(seen.insert(id), "ID {id} handed out twice");
    }

    // Without a client certificate the agent (verify_incoming) refuses
    // the client crate, and the error says so.
    let no_cert =
        idgen_client::ConsulDiscovery::new(format!("https://localhost:{}", consul.addr().port()))
            .tls(idgen_client::ConsulTls::from_files(&p.consul_ca.cert, None, None).unwrap());
    let err = match idgen_client::Client::builder()
        .consul(no_cert)
        .build()
        .await
    {
        Ok(_) => panic!("a client without a certificate got in"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("TLS"), "{err}");

    for n in nodes {
        assert!(n.terminate().success());
    }
    assert!(consul.services().is_empty(), "deregistered over HTTPS");
    assert!(
        consul.sessions().is_empty(),
        "sessions destroyed over HTTPS"
    );
}

/// `GET /v1/agent/checks` of `agent` over HTTPS.
async fn agent_checks(_consul: &TestConsul, agent: SocketAddr, p: &Pki) -> serde_json::Value {
    let ca = reqwest::Certificate::from_pem(&pem(&p.consul_ca.cert)).unwrap();
    let mut identity = pem(&p.node_client.0);
    identity.extend(pem(&p.node_client.1));
    let http = reqwest::Client::builder()
        .add_root_certificate(ca)
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .build()
        .unwrap();
    http.get(format!(
        "https://localhost:{}/v1/agent/checks",
        agent.port()
    ))
    .send()
    .await
    .expect("agent/checks over HTTPS")
    .json()
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_trust_consuls_certificate_or_lacks_a_client_certificate_stops_at_start(
) {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let consul = https_consul(&p).await;

    // The CA of idgen's own ports did not sign Consul's certificate.
    let config = node_config(
        dir.path(),
        "wrong-ca",
        consul.addr(),
        &p,
        &p.idgen_ca.cert,
        &[],
    );
    let log = ChildServer::try_start(&config, &[])
        .err()
        .expect("refused at start");
    assert!(
        log.contains("not signed by a CA in consul.ca_file")
            && log.contains(&p.idgen_ca.cert.display().to_string()),
        "{log}"
    );

    // Without a client certificate the agent (verify_incoming) refuses
    // the handshake.
    let config = node_config(
        dir.path(),
        "no-cert",
        consul.addr(),
        &p,
        &p.consul_ca.cert,
        &[
            ("consul", "cert_file", "\"\""),
            ("consul", "key_file", "\"\""),
        ],
    );
    let log = ChildServer::try_start(&config, &[])
        .err()
        .expect("refused at start");
    assert!(log.contains("consul.cert_file"), "{log}");

    // A CA file that holds no certificate is named with the key.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let config = node_config(dir.path(), "junk-ca", consul.addr(), &p, &junk, &[]);
    let log = ChildServer::try_start(&config, &[])
        .err()
        .expect("refused at start");
    assert!(
        log.contains("consul.ca_file")
            && log.contains(&junk.display().to_string())
            && log.contains("no PEM CERTIFICATE block"),
        "{log}"
    );
    assert!(consul.sessions().is_empty(), "nothing claimed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_against_https_and_https_against_http_fail_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let https = https_consul(&p).await;
    let plain = common::test_consul().await;

    // http:// to the HTTPS agent.
    let client = ConsulClient::new(ConsulConfig {
        address: format!("http://{}", https.addr()),
        retries: 0,
        ..ConsulConfig::default()
    })
    .unwrap();
    let err = client
        .kv_get("idgen/x", Consistency::Consistent)
        .await
        .expect_err("plaintext to HTTPS")
        .to_string();
    assert!(
        err.contains("serves HTTPS") && err.contains("https://"),
        "{err}"
    );

    // https:// to the plaintext agent.
    let tls = ConsulTls::load(&ConsulTlsFiles {
        ca_file: p.consul_ca.cert.clone(),
        ..ConsulTlsFiles::default()
    })
    .unwrap();
    let client = ConsulClient::new(ConsulConfig {
        address: format!("https://localhost:{}", plain.addr().port()),
        retries: 0,
        tls: Some(tls.clone()),
        ..ConsulConfig::default()
    })
    .unwrap();
    let err = client
        .kv_get("idgen/x", Consistency::Consistent)
        .await
        .expect_err("TLS to plaintext")
        .to_string();
    assert!(
        err.contains("does not speak TLS") && err.contains("http://"),
        "{err}"
    );

    // The scheme and the TLS settings must agree before anything is sent.
    let err = ConsulClient::new(ConsulConfig {
        address: format!("https://{}", https.addr()),
        ..ConsulConfig::default()
    })
    .expect_err("https without a CA")
    .to_string();
    assert!(err.contains("consul.ca_file"), "{err}");
    let err = ConsulClient::new(ConsulConfig {
        address: format!("http://{}", plain.addr()),
        tls: Some(tls),
        ..ConsulConfig::default()
    })
    .expect_err("http with a CA")
    .to_string();
    assert!(err.contains("use https://"), "{err}");

    // The config says the same when the node starts.
    let config = write_cluster_config(
        dir.path(),
        "mixed",
        plain.addr(),
        &[("consul", "ca_file", &toml_path(&p.consul_ca.cert))],
    );
    let log = ChildServer::try_start(&config, &[]).err().expect("refused");
    assert!(
        log.contains("consul.address") && log.contains("use https://"),
        "{log}"
    );
    let config = write_cluster_config(
        dir.path(),
        "no-ca",
        plain.addr(),
        &[(
            "consul",
            "address",
            &format!("\"https://{}\"", plain.addr()),
        )],
    );
    let log = ChildServer::try_start(&config, &[]).err().expect("refused");
    assert!(
        log.contains("consul.ca_file") && log.contains("is empty"),
        "{log}"
    );

    // The CLI's discovery asks for the CA of an https:// agent.
    let (ok, out) = common::run_idgen_with_env(
        &[
            "gen",
            "--discover",
            "consul",
            "--consul",
            &format!("https://{}", https.addr()),
        ],
        &[],
    );
    assert!(!ok && out.contains("--consul-ca"), "{out}");
}

#[test]
fn the_checks_tls_server_name_is_one_the_certificate_carries() {
    use idgen::config::TlsSettings;
    use idgen::server::tls::check_server_name;
    let dir = tempfile::tempdir().unwrap();
    let ca = ca(dir.path(), "names");
    let settings = |(cert, key): (PathBuf, PathBuf)| TlsSettings {
        cert,
        key,
        client_ca: None,
        client_required: false,
    };
    let local: std::net::IpAddr = [127, 0, 0, 1].into();
    let other: std::net::IpAddr = [10, 0, 0, 7].into();

    // The advertised IP, when the certificate carries it.
    let with_ip = settings(leaf_cert(
        dir.path(),
        &ca,
        "ip",
        &["idgen.internal", "127.0.0.1"],
    ));
    assert_eq!(
        check_server_name(&with_ip, local, None).unwrap(),
        "127.0.0.1"
    );
    // Else its first DNS name that is not a wildcard.
    assert_eq!(
        check_server_name(&with_ip, other, None).unwrap(),
        "idgen.internal"
    );
    let wild = settings(leaf_cert(
        dir.path(),
        &ca,
        "wild",
        &["*.idgen.internal", "node-a.idgen.internal"],
    ));
    assert_eq!(
        check_server_name(&wild, local, None).unwrap(),
        "node-a.idgen.internal"
    );
    // A configured name must be in the certificate (wildcards match one
    // label).
    assert_eq!(
        check_server_name(&wild, local, Some("node-b.idgen.internal")).unwrap(),
        "node-b.idgen.internal"
    );
    let err = check_server_name(&wild, local, Some("a.b.idgen.internal"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("consul.check_tls_server_name"), "{err}");
    // Neither the IP nor a plain DNS name: the check could never pass.
    let only_wild = settings(leaf_cert(
        dir.path(),
        &ca,
        "only-wild",
        &["*.idgen.internal"],
    ));
    let err = check_server_name(&only_wild, local, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("set consul.check_tls_server_name"), "{err}");
}

/// The node's Consul client certificate rotated in place: a file that
/// cannot be used is refused and counted, the node keeps serving on the
/// files in use; the new certificate is reloaded and counted; IDs never
/// repeat through it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_consul_client_certificate_is_reloaded_and_a_bad_one_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let consul = https_consul(&p).await;
    // The node's own copies, rotated in place (written, then renamed over).
    let (cert, key) = (dir.path().join("rot.crt"), dir.path().join("rot.key"));
    std::fs::copy(&p.node_client.0, &cert).unwrap();
    std::fs::copy(&p.node_client.1, &key).unwrap();
    let replace = |path: &Path, bytes: &[u8]| {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    };
    let (cert_toml, key_toml) = (toml_path(&cert), toml_path(&key));
    let node = ChildServer::start(&node_config(
        dir.path(),
        "n0",
        consul.addr(),
        &p,
        &p.consul_ca.cert,
        &[
            ("consul", "cert_file", &cert_toml),
            ("consul", "key_file", &key_toml),
        ],
    ));
    let root = der_of(&p.idgen_ca.cert);
    let reloads = |result: &'static str| {
        let root = root.clone();
        let http = node.http;
        async move {
            let text = common::tls::https_get(http, &root, "/metrics").await;
            let line = format!("idgen_consul_tls_reloads_total{{result=\"{result}\"}}");
            common::metric(&text, &line).unwrap_or(-1.0)
        }
    };
    assert_eq!(reloads("ok").await, 0.0, "registered at zero");
    assert_eq!(reloads("error").await, 0.0, "registered at zero");
    let mut c = grpc_client(node.grpc, &root).await.expect("TLS gRPC");
    let mut seen = HashSet::new();
    let mut issue = async |c: &mut idgen::proto::id_gen_client::IdGenClient<_>| {
        let ids = c
            .gen_ids(GenIdsRequest {
                mode: Mode::Snowflake as i32,
                tag: String::new(),
                count: 100,
            })
            .await
            .expect("the node keeps issuing")
            .into_inner()
            .ids;
        for id in ids {
            assert!(seen.insert(id), "ID {id} handed out twice");
        }
    };
    issue(&mut c).await;

    // A key that is not one: refused, counted, the files in use kept.
    replace(&key, b"not a key");
    let refused = eventually(Duration::from_secs(10), || async {
        reloads("error").await >= 1.0
    })
    .await;
    assert!(refused, "the bad key was read and refused");
    // Longer than the session TTL: the node renews on the files in use.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        issue(&mut c).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A new certificate from the agent's CA, with its key.
    let (new_cert, new_key) =
        leaf_cert(dir.path(), &p.consul_ca, "idgen-node-2", &["idgen-node-2"]);
    replace(&cert, &pem(&new_cert));
    replace(&key, &pem(&new_key));
    let reloaded = eventually(Duration::from_secs(10), || async {
        reloads("ok").await >= 1.0
    })
    .await;
    assert!(reloaded, "the rotated certificate was reloaded");
    issue(&mut c).await;
    assert!(node.terminate().success(), "clean shutdown over HTTPS");
    assert!(consul.sessions().is_empty(), "session destroyed over HTTPS");
}
