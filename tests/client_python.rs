//! The Python example client (`examples/python/`, grpcio) against a
//! 3-node cluster on the Consul test server: it discovers the nodes,
//! retries past a node that refuses connections, prefetches, and every ID
//! it collects is distinct.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_discovers_retries_and_prefetches_against_three_nodes() {
    let Some(python) = python() else {
        assert!(
            std::env::var_os("REQUIRE_PYTHON_EXAMPLE").is_none(),
            "REQUIRE_PYTHON_EXAMPLE is set but no Python with grpcio: run scripts/setup.sh"
        );
        eprintln!("no Python with grpcio (run scripts/setup.sh): the Python example was not run");
        return;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let gen = tempfile::tempdir().unwrap();
    // Stubs generated now, from the repository's proto (not committed).
    let out = Command::new(&python)
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

    let script = root.join("examples/python/idgen_client.py");
    let consul_url = format!("http://{}", consul.addr());
    let gen_path = gen.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&python)
            .arg(script)
            .args(["--consul", &consul_url, "--count", "4000", "--threads", "4"])
            .args(["--also", &dead.to_string()])
            .env("PYTHONPATH", gen_path)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.trim().lines().last().unwrap_or("")).expect("JSON summary");
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
