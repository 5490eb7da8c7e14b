//! The Python example client (`examples/python/`, grpcio) against a
//! 3-node cluster on the Consul test server: it discovers the nodes,
//! retries past a node that refuses connections, prefetches, and every ID
//! it collects is distinct; against an ACL-enabled one it reads Consul's
//! token variables and takes formatted IDs.
//!
//! Needs a Python with grpcio and grpcio-tools: `$IDGEN_PYTHON`, or the
//! virtualenv `scripts/setup.sh` makes (`${TMPDIR:-/tmp}/idgen-py-venv`).
//! Without one the test says so and passes, unless
//! `REQUIRE_PYTHON_EXAMPLE` is set (scripts/test.sh sets it).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{test_consul, write_cluster_config, ChildServer};

fn python() -> Option<PathBuf> {
    let candidate = match std::env::var_os("IDGEN_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => std::env::temp_dir().join("idgen-py-venv/bin/python"),
    };
    let ok = Command::new(&candidate)
        .args(["-c", "import grpc, grpc_tools"])
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(candidate)
}

/// The Python to run the example with; `None` (after saying so) when there
/// is none, which fails the test when `REQUIRE_PYTHON_EXAMPLE` is set.
fn python_or_skip() -> Option<PathBuf> {
    let python = python();
    if python.is_none() {
        assert!(
            std::env::var_os("REQUIRE_PYTHON_EXAMPLE").is_none(),
            "REQUIRE_PYTHON_EXAMPLE is set but no Python with grpcio: run scripts/setup.sh"
        );
        eprintln!("no Python with grpcio (run scripts/setup.sh): the Python example was not run");
    }
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_discovers_retries_and_prefetches_against_three_nodes() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let gen = stubs(&python);

    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<ChildServer> = ["a", "b", "c"]
        .iter()
        .map(|n| ChildServer::start(&write_cluster_config(dir.path(), n, consul.addr(), &[])))
        .collect();
    let url = format!("http://{}/v1/health/service/idgen?passing", consul.addr());
    let mut listed = 0;
    for _ in 0..200 {
        let v: Vec<serde_json::Value> = reqwest::get(&url).await.unwrap().json().await.unwrap();
        listed = v.len();
        if listed == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(listed, 3, "three passing nodes in Consul");
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();

    let args = ["--consul", &format!("http://{}", consul.addr())]
        .into_iter()
        .chain(["--count", "4000", "--threads", "4"])
        .chain(["--also", &dead.to_string()])
        .map(str::to_owned)
        .collect();
    let (ok, summary, text) = run_example(&python, gen.path(), args, Vec::new()).await;
    assert!(ok, "the example failed: {text}");
    assert_eq!(summary["nodes"], 3, "{summary}");
    assert_eq!(summary["ids"], 4050, "{summary}");
    assert_eq!(summary["distinct"], 4050, "no ID twice: {summary}");
    assert_eq!(
        summary["workers"].as_array().map(Vec::len),
        Some(3),
        "every node served: {summary}"
    );
    drop(nodes);
    consul.shutdown().await;
}

/// Python stubs generated now from the repository's proto (not committed),
/// in a temporary directory.
fn stubs(python: &std::path::Path) -> tempfile::TempDir {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let gen = tempfile::tempdir().unwrap();
    let out = Command::new(python)
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(root.join("proto"))
        .arg(format!("--python_out={}", gen.path().display()))
        .arg(format!("--grpc_python_out={}", gen.path().display()))
        .arg(root.join("proto/idgen/v1/idgen.proto"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "protoc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    gen
}

/// Runs the example with `args` and `env` (Consul's variables cleared
/// first); returns whether it succeeded, its JSON summary line (if any) and
/// its output.
async fn run_example(
    python: &std::path::Path,
    gen: &std::path::Path,
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> (bool, serde_json::Value, String) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/python/idgen_client.py");
    let (python, gen) = (python.to_owned(), gen.to_owned());
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(&python);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CONSUL_") {
                cmd.env_remove(name);
            }
        }
        cmd.arg(script)
            .args(args)
            .envs(env)
            .env("PYTHONPATH", gen)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let text = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let summary = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or(serde_json::Value::Null);
    (out.status.success(), summary, text)
}

/// docs/CLUSTER.md's secure walkthrough, with ACLs on: without a token the example is
/// refused (403, saying which variable to set); with CONSUL_HTTP_TOKEN, or
/// CONSUL_HTTP_TOKEN_FILE, and CONSUL_HTTP_ADDR without a scheme, it finds
/// the nodes, and takes formatted IDs (distinct), parses one and reads the
/// counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_uses_consuls_token_variables_and_takes_formatted_ids() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let gen = stubs(&python);
    let consul = common::consul::acl_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<ChildServer> = ["a", "b"]
        .iter()
        .map(|n| {
            ChildServer::start(&common::write_format_cluster_config(
                dir.path(),
                n,
                consul.addr(),
            ))
        })
        .collect();
    let addr = consul.addr().to_string();
    let token_file = dir.path().join("consul.token");
    std::fs::write(&token_file, "reader\n").unwrap();
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--count", "400", "--threads", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let var = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    // Wait (at most 10 s) until both nodes are passing, as the token sees it.
    let mut last = String::new();
    let mut listed = false;
    for _ in 0..50 {
        let env = vec![
            var("CONSUL_HTTP_ADDR", &addr),
            var("CONSUL_HTTP_TOKEN", "reader"),
        ];
        let (ok, summary, text) =
            run_example(&python, gen.path(), args(&["--format", "orders-py"]), env).await;
        if ok && summary["nodes"] == 2 {
            assert_eq!(summary["formatted"], 400, "{summary}");
            assert_eq!(
                summary["formatted_distinct"], 400,
                "no formatted ID twice: {summary}"
            );
            // Per-node format: the answering node's counter, used or not.
            assert!(summary["counter_used"].is_boolean(), "{summary}");
            listed = true;
            break;
        }
        last = text;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        listed,
        "the example never saw both nodes with CONSUL_HTTP_TOKEN: {last}"
    );
    // No token: refused, and told what to set.
    let env = vec![var("CONSUL_HTTP_ADDR", &addr)];
    let (ok, _, text) = run_example(&python, gen.path(), args(&[]), env).await;
    assert!(!ok, "served without a token: {text}");
    assert!(
        text.contains("403") && text.contains("CONSUL_HTTP_TOKEN"),
        "{text}"
    );
    // The token file wins over a wrong token, as in Consul.
    let env = vec![
        var("CONSUL_HTTP_ADDR", &format!("http://{addr}")),
        var("CONSUL_HTTP_TOKEN", "wrong"),
        var("CONSUL_HTTP_TOKEN_FILE", token_file.to_str().unwrap()),
    ];
    let (ok, summary, text) =
        run_example(&python, gen.path(), args(&["--format", "orders-py"]), env).await;
    assert!(ok, "{text}");
    assert_eq!(summary["distinct"], summary["ids"], "{summary}");
    assert_eq!(summary["formatted_distinct"], 400, "{summary}");
    drop(nodes);
    consul.shutdown().await;
}

/// TLS to idgen itself, as docs/CLIENTS.md shows it: `--ca`
/// (grpc.ssl_channel_credentials) and `--tls-server-name` for a node whose
/// certificate names a host while it is dialled by IP address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_dials_a_tls_node_with_its_ca_and_server_name() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let gen = stubs(&python);
    let dir = tempfile::tempdir().unwrap();
    let cert = common::tls::self_signed_cert(dir.path(), "node", &["idgen.internal"]);
    let mut config = common::test_config(dir.path());
    config.server.tls = Some(idgen::config::TlsSettings {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        client_required: false,
        client_ca: None,
    });
    let node = common::TestServer::start(config).await;
    // A Consul that lists no node: the example dials the one given.
    let consul = test_consul().await;
    let args: Vec<String> = [
        "--consul",
        &format!("http://{}", consul.addr()),
        "--also",
        &node.grpc.to_string(),
        "--count",
        "200",
        "--threads",
        "2",
        "--ca",
        cert.cert.to_str().unwrap(),
        "--tls-server-name",
        "idgen.internal",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (ok, summary, text) = run_example(&python, gen.path(), args, Vec::new()).await;
    assert!(ok, "{text}");
    assert_eq!(summary["ids"], 250, "{summary}");
    assert_eq!(summary["distinct"], 250, "{summary}");
    consul.shutdown().await;
}
