//! Several embedded nodes side by side: lease IDs of nodes with distinct
//! (datacenter, worker) never collide with the default settings, and
//! explicit settings that would make two of them share a token are
//! refused.

mod common;

use std::collections::HashSet;
use std::path::Path;

use common::{run_idgen, ChildServer, TestServer};
use idgen::config::{Config, FileConfig};
use idgen::id::lease::decompose;
use idgen::id::{Clock, SystemClock};
use idgen::proto::{DecodeIdRequest, GenIdsRequest, Mode};

/// An embedded node's config as an operator writes it: lease enabled with
/// the defaults, its own state file, its own worker id.
fn node_file(dir: &Path, datacenter: u64, worker: u64) -> FileConfig {
    let mut f = FileConfig::default();
    f.store.path = dir.join(format!("state-{datacenter}-{worker}.redb"));
    f.store.init_if_missing = true;
    f.server.grpc_listen = "127.0.0.1:0".into();
    f.server.http_listen = "127.0.0.1:0".into();
    f.node.datacenter_id = datacenter;
    f.node.worker_id = worker;
    f.lease.enabled = true;
    f
}

fn node(dir: &Path, datacenter: u64, worker: u64) -> Config {
    node_file(dir, datacenter, worker)
        .validate(SystemClock.now_millis())
        .expect("valid config")
}

async fn lease_ids(server: &TestServer, n: u32) -> Vec<u64> {
    let mut c = server.client().await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.extend(
            c.gen_ids(GenIdsRequest {
                mode: Mode::Lease as i32,
                tag: String::new(),
                count: n,
            })
            .await
            .expect("lease ids")
            .into_inner()
            .ids,
        );
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_nodes_with_distinct_worker_ids_give_disjoint_lease_ids() {
    let dir = tempfile::tempdir().unwrap();
    // Two workers of one datacenter, and one of another datacenter.
    let nodes = [(0, 0), (0, 1), (1, 0)];
    let mut servers = Vec::new();
    for (dc, w) in nodes {
        servers.push(TestServer::start(node(dir.path(), dc, w)).await);
    }
    let mut all = HashSet::new();
    let mut tokens = Vec::new();
    for (server, (dc, w)) in servers.iter().zip(nodes) {
        let ids = lease_ids(server, 500).await;
        assert_eq!(ids.len(), 2000);
        let mut mine = HashSet::new();
        for id in &ids {
            assert!(all.insert(*id), "lease ID {id} handed out by two nodes");
            mine.insert(decompose(*id).unwrap().token);
        }
        assert_eq!(mine.len(), 1, "node {dc}/{w} used {mine:?}");
        let token = *mine.iter().next().unwrap();
        // DecodeId reports the same token.
        let d = server
            .client()
            .await
            .decode_id(DecodeIdRequest {
                id: ids[0],
                mode: Mode::Lease as i32,
                tag: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(u64::from(d.token), token);
        tokens.push(token);
    }
    let distinct: HashSet<_> = tokens.iter().collect();
    assert_eq!(distinct.len(), 3, "tokens {tokens:?} must differ per node");
    // The default layout (5 + 5 node bits) gives each node 64 tokens.
    assert_eq!(tokens, vec![0, 64, 2048]);
    for s in servers {
        s.stop().await;
    }
}

#[test]
fn explicit_lease_settings_that_share_a_token_space_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Worker 1 told to use token 0, which worker 0 (with the defaults)
    // starts at: refused, naming the key, the range and the owner.
    let mut f = node_file(dir.path(), 0, 1);
    f.lease.token = Some(0);
    let err = f
        .validate(SystemClock.now_millis())
        .unwrap_err()
        .to_string();
    assert!(err.contains("lease.token"), "{err}");
    assert!(
        err.contains("outside this node's own range 64 to 127"),
        "{err}"
    );
    assert!(
        err.contains("belongs to datacenter 0, worker 0"),
        "names the owner: {err}"
    );
    assert!(err.contains("Remove lease.token"), "says what to do: {err}");
    // A token of its own range is fine; so is any zone (ranges are
    // disjoint within every zone).
    f.lease.token = Some(100);
    f.lease.zone = 9;
    let c = f.validate(SystemClock.now_millis()).unwrap();
    assert_eq!(c.lease.map(|l| (l.zone, l.token)), Some((9, Some(100))));
    // A layout with more node bits than token bits cannot give every node
    // a range of its own: refused with a way out.
    let mut f = node_file(dir.path(), 0, 1);
    f.layout.preset = "twitter".into();
    f.layout.datacenter_bits = Some(8);
    f.layout.worker_bits = Some(9);
    f.layout.sequence_bits = Some(5);
    let err = f
        .validate(SystemClock.now_millis())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("lease.enabled") && err.contains("consul"),
        "{err}"
    );
}

/// A format whose counter is cluster-wide is, on the embedded store, one
/// node's like segment and strict (two nodes with their own state files
/// hand out the same IDs): `idgen check-config` and the node's start-up log
/// name it, and not a format that renders the node.
#[test]
fn a_cluster_wide_format_on_the_embedded_store_is_named_at_start_and_by_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idgen.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\
             [store]\npath = \"{}\"\ninit_if_missing = true\n\
             [log]\nformat = \"json\"\nlevel = \"info\"\n\
             [[formats]]\nname = \"orders\"\ntemplate = \"{{yyyy}}{{MM}}{{dd}}{{seq:6}}\"\nreset = \"day\"\n\
             [[formats]]\nname = \"per-node\"\ntemplate = \"{{node:4}}{{seq:6}}\"\n",
            dir.path().join("state.redb").display()
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let (ok, out) = run_idgen(&["check-config", "--config", cfg]);
    assert!(ok, "{out}");
    let warning = out
        .lines()
        .find(|l| l.starts_with("warning:"))
        .unwrap_or_else(|| panic!("no warning in: {out}"));
    assert!(
        warning.contains("\"orders\"") && !warning.contains("per-node"),
        "{warning}"
    );
    assert!(warning.contains("consul"), "says what to do: {warning}");

    let node = ChildServer::start(&config);
    let log = node.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("keep one counter for the whole cluster"))
        .unwrap_or_else(|| panic!("no start-up warning in: {log}"));
    assert!(line.contains("WARN") && line.contains("orders"), "{line}");
    assert!(!line.contains("per-node"), "{line}");
    assert!(node.terminate().success());
}
