//! The idgen-client crate and the CLI configured the consul CLI's way
//! against an ACL-enabled Consul test server: refused without a token,
//! served with CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE (explicit env
//! maps in-process; the real process environment in a child `idgen`), and
//! formatted IDs through discovery (client and `idgen gen --discover
//! --format`, `idgen format parse|counter`).

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::{write_format_cluster_config, ChildServer};
use consul_testserver::TestConsul;
use idgen_client::{Client, ConsulDiscovery, ConsulEnv, Error, Mode};

/// An ACL-enabled test Consul (master token `master`) with a token
/// `reader` that may read everything, and two nodes serving format
/// `orders-py`.
async fn acl_cluster(dir: &Path) -> (TestConsul, Vec<ChildServer>) {
    let consul = common::consul::acl_consul().await;
    let nodes = ["a", "b"]
        .iter()
        .map(|n| ChildServer::start(&write_format_cluster_config(dir, n, consul.addr())))
        .collect();
    (consul, nodes)
}

fn vars(pairs: &[(&str, &str)]) -> ConsulEnv {
    ConsulEnv::from_vars(pairs.iter().copied())
}

async fn build(discovery: ConsulDiscovery) -> Result<Client, Error> {
    Client::builder()
        .consul(discovery.wait(Duration::from_secs(5)))
        .deadline(Duration::from_secs(3))
        .build()
        .await
}

/// Waits (at most 15 s) until a client with `env` knows both nodes.
async fn client_of_both(consul: SocketAddr, env: ConsulEnv) -> Client {
    let mut last = String::new();
    for _ in 0..150 {
        match build(ConsulDiscovery::new(format!("http://{consul}")).env(env.clone())).await {
            Ok(c) if c.nodes().len() == 2 => return c,
            Ok(c) => last = format!("knows {:?}", c.nodes()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no client saw both nodes: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuls_token_variables_open_an_acl_enabled_consul_and_formatted_ids_never_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let (consul, nodes) = acl_cluster(dir.path()).await;
    let addr = consul.addr();
    let client = client_of_both(addr, vars(&[("CONSUL_HTTP_TOKEN", "reader")])).await;
    assert!(client.gen_id(Mode::Snowflake, "").await.unwrap() > 0);

    // No token: refused, and the error names the variables to set.
    let none = ConsulDiscovery::new(format!("http://{addr}")).env(ConsulEnv::default());
    let e = build(none)
        .await
        .expect_err("listed without a token")
        .to_string();
    assert!(e.contains("403") && e.contains("CONSUL_HTTP_TOKEN"), "{e}");

    // The token file wins over a wrong CONSUL_HTTP_TOKEN (Consul's rule),
    // and CONSUL_HTTP_ADDR without a scheme is http://.
    let file = dir.path().join("consul.token");
    std::fs::write(&file, "reader\n").unwrap();
    let addr_s = addr.to_string();
    let env = vars(&[
        ("CONSUL_HTTP_ADDR", addr_s.as_str()),
        ("CONSUL_HTTP_TOKEN", "wrong"),
        ("CONSUL_HTTP_TOKEN_FILE", file.to_str().unwrap()),
    ]);
    let from_env = build(ConsulDiscovery::from_consul_env(env.clone()).unwrap())
        .await
        .expect("served with the token file");
    assert_eq!(from_env.nodes().len(), 2);
    // An explicit token wins over the variables.
    let explicit = ConsulDiscovery::from_consul_env(env)
        .unwrap()
        .token("wrong");
    let e = build(explicit)
        .await
        .expect_err("a wrong explicit token")
        .to_string();
    assert!(e.contains("403") && e.contains("no service:read"), "{e}");

    // Formatted IDs through discovery: spread over both nodes, none twice.
    let mut seen = HashSet::new();
    let mut per_node = HashSet::new();
    for _ in 0..40 {
        let got = client
            .gen_formatted("orders-py", Vec::<(String, String)>::new(), 10)
            .await
            .expect("gen_formatted");
        assert_eq!(got.ids.len(), 10);
        for id in got.ids {
            // {yyyy}{MM}{dd}-{node:4}-{seq:6}
            per_node.insert(id.split('-').nth(1).unwrap_or_default().to_owned());
            assert!(seen.insert(id.clone()), "{id} issued twice");
        }
    }
    assert_eq!(seen.len(), 400);
    assert_eq!(per_node.len(), 2, "both nodes served: {per_node:?}");
    let last = seen.iter().max().unwrap().clone();
    let parsed = client.parse_formatted("orders-py", &last).await.unwrap();
    assert!(parsed.node.is_some() && parsed.year.is_some(), "{parsed:?}");
    let counter = client
        .format_counter("orders-py", Vec::<(String, String)>::new())
        .await
        .unwrap();
    assert!(
        counter.used && counter.next_period_start_ms > 0,
        "{counter:?}"
    );
    // The period is the day's start (seconds), not a count of periods.
    assert_eq!(counter.period % 86_400, 0, "{counter:?}");
    let now_s = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    assert!((now_s - counter.period).abs() < 2 * 86_400, "{counter:?}");
    let e = client
        .gen_formatted("no-such-format", Vec::<(String, String)>::new(), 1)
        .await
        .expect_err("an unknown format");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    drop(nodes);
    consul.shutdown().await;
}

/// The CLI reads the real process environment (the child's): refused
/// without CONSUL_HTTP_TOKEN, served with it; `gen --discover consul
/// --format` gives formatted IDs; `format parse` and `format counter`
/// answer, the counter's period printed as a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_uses_consuls_variables_and_formatted_ids_work_through_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let (consul, nodes) = acl_cluster(dir.path()).await;
    // Both nodes registered and passing, as the token sees them.
    let _ = client_of_both(consul.addr(), vars(&[("CONSUL_HTTP_TOKEN", "reader")])).await;
    let addr = consul.addr().to_string();
    let run = |args: Vec<String>, env: Vec<(&'static str, String)>| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::run_idgen_with_env(&args, &env)
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let with_token = || {
        vec![
            ("CONSUL_HTTP_ADDR", addr.clone()),
            ("CONSUL_HTTP_TOKEN", "reader".to_owned()),
        ]
    };

    let (ok, out) = tokio::task::spawn_blocking({
        let (a, e) = (
            args(&["gen", "--discover", "consul", "-n", "3"]),
            vec![("CONSUL_HTTP_ADDR", addr.clone())],
        );
        move || run(a, e)
    })
    .await
    .unwrap();
    assert!(
        !ok && out.contains("403") && out.contains("CONSUL_HTTP_TOKEN"),
        "{out}"
    );

    let gen = args(&[
        "gen",
        "--discover",
        "consul",
        "--format",
        "orders-py",
        "-n",
        "25",
        "--batch",
        "10",
    ]);
    let (ok, out) = tokio::task::spawn_blocking({
        let e = with_token();
        move || run(gen, e)
    })
    .await
    .unwrap();
    assert!(ok, "{out}");
    let ids: Vec<&str> = out.lines().collect();
    assert_eq!(ids.len(), 25, "{out}");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 25, "{out}");
    let id = ids[24].to_owned();

    let parse = args(&[
        "format",
        "parse",
        "orders-py",
        &id,
        "--discover",
        "consul",
        "--json",
    ]);
    let (ok, out) = tokio::task::spawn_blocking({
        let e = with_token();
        move || run(parse, e)
    })
    .await
    .unwrap();
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert!(v["node"].is_u64() && v["seq"].is_u64(), "{v}");
    // With an admin token, `--discover` asks the passing nodes by address
    // with it (the client crate sends none): these nodes have the admin
    // API off, so each refuses it, and the command says so.
    let reveal = args(&[
        "format",
        "parse",
        "orders-py",
        &id,
        "--discover",
        "consul",
        "--admin-token",
        "some-token",
    ]);
    let (ok, out) = tokio::task::spawn_blocking({
        let e = with_token();
        move || run(reveal, e)
    })
    .await
    .unwrap();
    assert!(
        !ok && out.contains("no passing node answered") && out.contains("admin API is disabled"),
        "{out}"
    );

    let counter = args(&["format", "counter", "orders-py", "--discover", "consul"]);
    let (ok, out) = tokio::task::spawn_blocking({
        let e = with_token();
        move || run(counter, e)
    })
    .await
    .unwrap();
    assert!(ok && out.contains("used "), "{out}");
    // A per-node counter: with --discover every node answers under its
    // address, never one arbitrary node for all.
    for node in &nodes {
        assert!(
            out.contains(&format!("node {}\n", node.grpc)),
            "node {} missing: {out}",
            node.grpc
        );
    }
    // Per-node format: each node shows its own counter; the one that
    // served prints its period as the day's start time.
    let mut outs = Vec::new();
    for node in &nodes {
        let counter = args(&[
            "format",
            "counter",
            "orders-py",
            "--addr",
            &node.grpc.to_string(),
        ]);
        let (ok, out) = tokio::task::spawn_blocking(move || run(counter, Vec::new()))
            .await
            .unwrap();
        assert!(ok, "{out}");
        outs.push(out);
    }
    // "period starting 2026-11-26T00:00:00 (the format zone's wall time)"
    let used: Vec<&String> = outs.iter().filter(|o| o.contains("used true")).collect();
    assert!(!used.is_empty(), "no node's counter used: {outs:?}");
    for out in used {
        assert!(
            out.contains("period starting ") && out.contains("T00:00:00"),
            "the period printed as a time: {out}"
        );
        assert!(out.contains("next period "), "{out}");
    }
    drop(nodes);
    consul.shutdown().await;
}

/// CONSUL_CACERT, CONSUL_CLIENT_CERT/_KEY, CONSUL_TLS_SERVER_NAME (its
/// port dropped), CONSUL_HTTP_SSL and CONSUL_HTTP_SSL_VERIFY against an
/// HTTPS test Consul with verify_incoming whose certificate names
/// server.dc1.consul and localhost, not 127.0.0.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuls_tls_variables_reach_an_https_agent_with_verify_incoming() {
    use common::tls::{ca, leaf_cert};
    let dir = tempfile::tempdir().unwrap();
    let consul_ca = ca(dir.path(), "consul");
    let agent = leaf_cert(
        dir.path(),
        &consul_ca,
        "consul-agent",
        &["server.dc1.consul", "localhost"],
    );
    let client = leaf_cert(dir.path(), &consul_ca, "app", &["app"]);
    let pem = |p: &Path| std::fs::read(p).unwrap();
    let consul = common::consul::start(consul_testserver::Config {
        https: Some(consul_testserver::HttpsConfig {
            cert_pem: pem(&agent.0),
            key_pem: pem(&agent.1),
            client_ca_pem: Some(pem(&consul_ca.cert)),
        }),
        ..common::consul::cluster_settings()
    })
    .await;
    let https = format!("https://{}", consul.addr());
    let bare = consul.addr().to_string();
    let (ca_s, cert_s, key_s) = (
        consul_ca.cert.to_str().unwrap(),
        client.0.to_str().unwrap(),
        client.1.to_str().unwrap(),
    );
    let full = [
        ("CONSUL_HTTP_ADDR", https.as_str()),
        ("CONSUL_CACERT", ca_s),
        ("CONSUL_CLIENT_CERT", cert_s),
        ("CONSUL_CLIENT_KEY", key_s),
        ("CONSUL_TLS_SERVER_NAME", "server.dc1.consul:8501"),
    ];
    let try_env = |pairs: Vec<(&str, &str)>| {
        let discovery = ConsulDiscovery::from_consul_env(vars(&pairs)).unwrap();
        build(discovery)
    };
    try_env(full.to_vec())
        .await
        .expect("every TLS variable set: the agent answers");
    // CONSUL_HTTP_SSL=true makes a bare host:port HTTPS.
    let mut ssl = full.to_vec();
    ssl[0] = ("CONSUL_HTTP_ADDR", bare.as_str());
    ssl.push(("CONSUL_HTTP_SSL", "true"));
    try_env(ssl).await.expect("CONSUL_HTTP_SSL=true");
    // Without the server name the certificate does not fit 127.0.0.1.
    let e = try_env(full[..4].to_vec())
        .await
        .expect_err("no server name");
    assert!(e.to_string().contains("not trusted"), "{e}");
    // Without a client certificate the agent refuses.
    let no_cert = vec![full[0], full[1], full[4]];
    try_env(no_cert)
        .await
        .expect_err("verify_incoming wants a certificate");
    // Checks off: no CA needed (a warning is logged).
    let unchecked = vec![
        full[0],
        full[2],
        full[3],
        ("CONSUL_HTTP_SSL_VERIFY", "false"),
    ];
    try_env(unchecked)
        .await
        .expect("CONSUL_HTTP_SSL_VERIFY=false");
    // No CA and checks on: says what to set.
    let e = try_env(vec![full[0], full[2], full[3]])
        .await
        .expect_err("no CA");
    assert!(e.to_string().contains("CONSUL_CACERT"), "{e}");
    consul.shutdown().await;
}
