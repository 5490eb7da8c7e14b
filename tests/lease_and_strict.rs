//! Lease and strict modes end to end, on the embedded store (one node) and
//! on the Consul test server (three `idgen serve` processes): uniqueness
//! under concurrent load, lease IDs decoding to their holder's token,
//! strict values checked for linearizability from recorded call times,
//! kill -9 in the middle of blocks and strict calls, and store outages.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    assert_linearizable, call_until_stopped, test_config, write_child_config, write_cluster_config,
    Call, ChildServer, TestServer,
};

use idgen::config::{LeaseModeSettings, StrictModeSettings};
use idgen::id::lease::decompose;
use idgen::proto::id_gen_client::IdGenClient;
use idgen::proto::{DecodeIdRequest, GenIdRequest, GenIdsRequest, Mode};
use tonic::transport::Channel;

fn gen(mode: Mode, tag: &str, count: u32) -> GenIdsRequest {
    GenIdsRequest {
        mode: mode as i32,
        tag: tag.into(),
        count,
    }
}

fn one(mode: Mode, tag: &str) -> GenIdRequest {
    GenIdRequest {
        mode: mode as i32,
        tag: tag.into(),
    }
}

const MODES: &[(&str, &str, &str)] = &[
    ("lease", "enabled", "true"),
    ("lease", "block", "100"),
    ("strict", "enabled", "true"),
    ("segment", "enabled", "true"),
    ("segment", "auto_create", "true"),
    ("segment", "default_step", "100"),
];

fn cluster_node(dir: &Path, name: &str, consul: std::net::SocketAddr) -> ChildServer {
    ChildServer::start(&write_cluster_config(dir, name, consul, MODES))
}

/// `callers` concurrent callers spread over `clients`, each making
/// `calls` strict calls on `key` (counts 1..=3), recording their times.
async fn strict_load(
    clients: Vec<IdGenClient<Channel>>,
    key: &str,
    callers: usize,
    calls: usize,
) -> Vec<Call> {
    let mut tasks = Vec::new();
    for i in 0..callers {
        let mut c = clients[i % clients.len()].clone();
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for j in 0..calls {
                let count = 1 + ((i + j) % 3) as u32;
                let start = Instant::now();
                let ids = c
                    .gen_ids(gen(Mode::Strict, &key, count))
                    .await
                    .expect("strict call")
                    .into_inner()
                    .ids;
                let end = Instant::now();
                assert_eq!(ids.len(), count as usize);
                assert!(
                    ids.windows(2).all(|w| w[1] == w[0] + 1),
                    "consecutive: {ids:?}"
                );
                got.push(Call {
                    start,
                    end,
                    first: ids[0],
                    last: ids[ids.len() - 1],
                });
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("caller"));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_values_from_three_cluster_nodes_are_linearizable() {
    // With Consul's latency modelled (2 ms a Raft write, 0.5 ms a
    // consistent read), so each node combines its callers' calls.
    let consul = common::consul::start(consul_testserver::Config {
        raft_write_delay: Duration::from_millis(2),
        consistent_read_delay: Duration::from_micros(500),
        ..common::consul::cluster_settings()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<ChildServer> = (0..3)
        .map(|i| cluster_node(dir.path(), &format!("k{i}"), consul.addr()))
        .collect();
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(n.client().await);
    }
    let calls = strict_load(clients.clone(), "books/moby-dick", 32, 15).await;
    assert_eq!(calls.len(), 32 * 15);
    assert_linearizable(&calls);
    // Gap-free here (no call failed): exactly the values handed out.
    let total: u64 = calls.iter().map(|c| c.last - c.first + 1).sum();
    let max = calls.iter().map(|c| c.last).max().unwrap();
    assert_eq!(max, total, "values 1..={total} with no gaps");
    let stored = consul
        .kv_get("idgen/test/strict/books/moby-dick")
        .expect("counter");
    assert_eq!(
        String::from_utf8_lossy(&stored.value).trim(),
        max.to_string()
    );
    // Several keys at once from the three nodes: each its own sequence,
    // each linearizable.
    let several = ["books/a", "books/b", "books/c", "books/d"];
    let loads = several.map(|k| strict_load(clients.clone(), k, 12, 8));
    let [a, b, c, d] = loads;
    let (a, b, c, d) = tokio::join!(a, b, c, d);
    for calls in [a, b, c, d] {
        assert_eq!(calls.len(), 12 * 8);
        assert_linearizable(&calls);
        let total: u64 = calls.iter().map(|c| c.last - c.first + 1).sum();
        assert_eq!(calls.iter().map(|c| c.last).max(), Some(total));
    }
    // Another key is its own sequence.
    let mut c = nodes[1].client().await;
    let v = c
        .gen_id(one(Mode::Strict, "books/dune"))
        .await
        .unwrap()
        .into_inner()
        .id;
    assert_eq!(v, 1);
    for n in nodes {
        assert!(n.terminate().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_ids_from_three_cluster_nodes_are_distinct_and_decode_to_their_holders_token() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<ChildServer> = (0..3)
        .map(|i| cluster_node(dir.path(), &format!("l{i}"), consul.addr()))
        .collect();
    let mut tasks = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for k in 0..3 {
            let mut c = n.client().await;
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for j in 0..40 {
                    let count = 1 + ((i * 31 + k * 7 + j * 11) % 150) as u32;
                    got.extend(
                        c.gen_ids(gen(Mode::Lease, "", count))
                            .await
                            .expect("lease ids")
                            .into_inner()
                            .ids,
                    );
                }
                (i, got)
            }));
        }
    }
    let mut seen = HashSet::new();
    let mut tokens_of: HashMap<usize, HashSet<u64>> = HashMap::new();
    let mut max_seq: HashMap<u64, u64> = HashMap::new();
    for t in tasks {
        let (node, got) = t.await.unwrap();
        for id in got {
            assert!(seen.insert(id), "duplicate lease ID {id}");
            let p = decompose(id).expect("a lease ID");
            assert_eq!(p.zone, 0);
            tokens_of.entry(node).or_default().insert(p.token);
            let m = max_seq.entry(p.token).or_default();
            *m = (*m).max(p.sequence);
        }
    }
    // One token per node, a different one each, held by that node.
    let mut all_tokens = HashSet::new();
    for (node, tokens) in &tokens_of {
        assert_eq!(tokens.len(), 1, "node {node} used {tokens:?}");
        let token = *tokens.iter().next().unwrap();
        assert!(all_tokens.insert(token), "token {token} shared");
        let entry = consul
            .kv_get(&format!("idgen/test/lease/0/{token}"))
            .expect("token key");
        assert!(entry.session.is_some(), "token {token} locked");
        let record: serde_json::Value = serde_json::from_slice(&entry.value).unwrap();
        assert_eq!(record["instance"], format!("l{node}"));
        assert!(record["reserved"].as_u64().unwrap() >= max_seq[&token]);
    }
    // DecodeId over gRPC gives the same fields.
    let id = *seen.iter().next().unwrap();
    let mut c = nodes[0].client().await;
    let d = c
        .decode_id(DecodeIdRequest {
            id,
            mode: Mode::Lease as i32,
            tag: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let p = decompose(id).unwrap();
    assert_eq!(
        (d.mode, d.zone as u64, d.token as u64, d.sequence),
        (Mode::Lease as i32, p.zone, p.token, p.sequence)
    );

    // A clean stop releases the token and keeps its counter; the restarted
    // instance takes its token back and continues above it.
    let token0 = *tokens_of[&0].iter().next().unwrap();
    let mut nodes = nodes;
    let first = nodes.remove(0);
    assert!(first.terminate().success());
    let entry = consul
        .kv_get(&format!("idgen/test/lease/0/{token0}"))
        .unwrap();
    assert!(entry.session.is_none(), "released on shutdown");
    let again = cluster_node(dir.path(), "l0", consul.addr());
    let mut c = again.client().await;
    let ids = c
        .gen_ids(gen(Mode::Lease, "", 50))
        .await
        .unwrap()
        .into_inner()
        .ids;
    for id in &ids {
        let p = decompose(*id).unwrap();
        assert_eq!(p.token, token0, "the instance gets its token back");
        assert!(p.sequence > max_seq[&token0]);
        assert!(seen.insert(*id));
    }
    assert!(again.terminate().success());
    for n in nodes {
        assert!(n.terminate().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_consul_outage_lease_serves_its_blocks_until_fenced_segment_its_buffers_and_strict_fails_fast(
) {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = consul.add_agent("agent-o").await.unwrap();
    let node = cluster_node(dir.path(), "o", agent);
    let mut c = node.client().await;
    let mut seen = HashSet::new();
    // Warm up every mode: both buffers full.
    for _ in 0..3 {
        for id in c
            .gen_ids(gen(Mode::Lease, "", 10))
            .await
            .unwrap()
            .into_inner()
            .ids
        {
            assert!(seen.insert(id));
        }
        let _ = c.gen_ids(gen(Mode::Segment, "outage", 10)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let strict_before = c
        .gen_id(one(Mode::Strict, "chat/room1"))
        .await
        .unwrap()
        .into_inner()
        .id;

    consul.faults().drop_requests("agent-o", true);
    let cut = Instant::now();
    // Lease (first: it is fenced about a second after the cut): serves
    // from its reserved blocks; once the lock deadline passes the node is
    // fenced and lease calls stop too.
    let c2 = node.client().await;
    let mut lease_served = 0;
    let e = loop {
        match c2.clone().gen_id(one(Mode::Lease, "")).await {
            Ok(r) => {
                assert!(seen.insert(r.into_inner().id), "duplicate");
                lease_served += 1;
            }
            Err(e) => break e,
        }
        assert!(lease_served <= 200, "served more than its blocks held");
        if lease_served % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(cut.elapsed() < Duration::from_secs(10), "never stopped");
    };
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(lease_served > 0, "nothing served from the blocks");

    // Strict needs the store for every call: UNAVAILABLE, fast, naming
    // the key.
    let strict_cut = Instant::now();
    let e = c.gen_id(one(Mode::Strict, "chat/room1")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("chat/room1"), "{e:?}");
    assert!(
        strict_cut.elapsed() < Duration::from_secs(5),
        "{:?}",
        strict_cut.elapsed()
    );

    // Segment: serves what it holds (at most two ranges of 100), then
    // UNAVAILABLE naming the tag.
    let mut segment_served = 0;
    let e = loop {
        match c.gen_id(one(Mode::Segment, "outage")).await {
            Ok(_) => segment_served += 1,
            Err(e) => break e,
        }
        assert!(segment_served <= 200, "served more than its buffers held");
    };
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("outage"), "{e:?}");
    assert!(segment_served > 0, "nothing served from the buffers");

    // Wait for the fence (deadline: TTL 2 s - margin 0.8 s after the last
    // renew), then lease calls name it.
    let fenced = loop {
        let e = c.gen_id(one(Mode::Lease, "")).await.unwrap_err();
        if e.message().contains("lost its worker lock") {
            break true;
        }
        if cut.elapsed() > Duration::from_secs(10) {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(fenced, "lease calls never reported the fence");

    // Heal: everything resumes, above what was handed out.
    consul.faults().drop_requests("agent-o", false);
    let resumed = Instant::now();
    let ids = loop {
        match c.gen_ids(gen(Mode::Lease, "", 20)).await {
            Ok(r) => break r.into_inner().ids,
            Err(_) if resumed.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("lease never resumed: {e:?}"),
        }
    };
    for id in ids {
        assert!(seen.insert(id), "{id} handed out twice");
    }
    let strict_after = c
        .gen_id(one(Mode::Strict, "chat/room1"))
        .await
        .unwrap()
        .into_inner()
        .id;
    assert!(strict_after > strict_before);
    assert!(node.terminate().success());
}

fn embedded_modes(dir: &Path) -> idgen::config::Config {
    let mut c = test_config(dir);
    c.lease = Some(LeaseModeSettings {
        zone: 3,
        token: Some(7),
        block: 50,
        hide: None,
    });
    c.strict = Some(StrictModeSettings {
        default_step: 1,
        ..StrictModeSettings::default()
    });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_strict_is_linearizable_and_lease_decodes_to_the_configured_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(embedded_modes(dir.path())).await;
    let clients = vec![server.client().await, server.client().await];
    let calls = strict_load(clients, "orders/2026", 32, 20).await;
    assert_linearizable(&calls);
    let max = calls.iter().map(|c| c.last).max().unwrap();

    let mut c = server.client().await;
    let mut seen = HashSet::new();
    for n in [1u32, 7, 49, 50, 51, 300] {
        for id in c
            .gen_ids(gen(Mode::Lease, "", n))
            .await
            .unwrap()
            .into_inner()
            .ids
        {
            let p = decompose(id).unwrap();
            assert_eq!((p.zone, p.token), (3, 7));
            assert!(seen.insert(id));
        }
    }
    // The JSON API serves both too.
    let body: serde_json::Value = reqwest::get(server.url("/v1/id?mode=strict&tag=orders/2026"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["id"], serde_json::json!((max + 1).to_string()));
    server.stop().await;

    // A restart continues above both.
    let server = TestServer::start(embedded_modes(dir.path())).await;
    let mut c = server.client().await;
    let v = c
        .gen_id(one(Mode::Strict, "orders/2026"))
        .await
        .unwrap()
        .into_inner()
        .id;
    assert_eq!(v, max + 2, "strict values are durable and gap-free here");
    for id in c
        .gen_ids(gen(Mode::Lease, "", 100))
        .await
        .unwrap()
        .into_inner()
        .ids
    {
        assert!(seen.insert(id), "{id} reused after a restart");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lease_and_strict_requests_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(embedded_modes(dir.path())).await;
    let mut c = server.client().await;
    let cases = [
        (
            gen(Mode::Strict, "", 1),
            tonic::Code::InvalidArgument,
            "needs a key",
        ),
        (
            gen(Mode::Strict, "nokey", 1),
            tonic::Code::InvalidArgument,
            "<namespace>/<key>",
        ),
        (
            gen(Mode::Strict, "Books/x", 1),
            tonic::Code::InvalidArgument,
            "malformed",
        ),
        (
            gen(Mode::Strict, "books/x", 0),
            tonic::Code::InvalidArgument,
            "count",
        ),
        (
            gen(Mode::Lease, "tag", 1),
            tonic::Code::InvalidArgument,
            "takes no tag",
        ),
    ];
    for (req, code, text) in cases {
        let e = c.gen_ids(req.clone()).await.unwrap_err();
        assert_eq!(e.code(), code, "{req:?}: {e:?}");
        assert!(e.message().contains(text), "{req:?}: {e:?}");
    }
    for id in [0u64, 1 << 63 | 5, 7 << 56] {
        let e = c
            .decode_id(DecodeIdRequest {
                id,
                mode: Mode::Lease as i32,
                tag: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{id}: {e:?}");
    }
    let e = c
        .decode_id(DecodeIdRequest {
            id: 5,
            mode: Mode::Strict as i32,
            tag: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    server.stop().await;

    // Not enabled: FAILED_PRECONDITION.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let mut c = server.client().await;
    for mode in [Mode::Lease, Mode::Strict] {
        let tag = if mode == Mode::Strict { "a/b" } else { "" };
        let e = c.gen_ids(gen(mode, tag, 1)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{mode:?}: {e:?}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_lease_blocks_and_strict_calls_never_leads_to_reuse() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[lease]\nenabled = true\nblock = 40\n[strict]\nenabled = true\n");
    std::fs::write(&config, text).unwrap();
    let mut seen_lease = HashSet::new();
    let mut strict_max = 0u64;
    let mut lease_total = 0;
    for round in 0..3 {
        let node = ChildServer::start(&config);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Strict callers in flight while the kill lands.
        let mut strict_tasks = Vec::new();
        for _ in 0..4 {
            let c = node.client().await;
            strict_tasks.push(call_until_stopped(
                c,
                gen(Mode::Strict, "ns/k", 3),
                Arc::clone(&stop),
            ));
        }
        // Lease callers in flight too: blocks of 40 in batches of 13 mean a
        // block reservation is running most of the time.
        let mut lease_tasks = Vec::new();
        for _ in 0..2 {
            let c = node.client().await;
            lease_tasks.push(call_until_stopped(
                c,
                gen(Mode::Lease, "", 13),
                Arc::clone(&stop),
            ));
        }
        let mut c = node.client().await;
        for _ in 0..30 {
            for id in c
                .gen_ids(gen(Mode::Lease, "", 13))
                .await
                .unwrap()
                .into_inner()
                .ids
            {
                assert!(seen_lease.insert(id), "round {round}: lease {id} twice");
            }
        }
        node.kill();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in lease_tasks {
            let got = t.await.unwrap();
            assert!(!got.is_empty(), "round {round}: concurrent lease calls ran");
            lease_total += got.len();
            for id in got {
                assert!(seen_lease.insert(id), "round {round}: lease {id} twice");
            }
        }
        lease_total += 30 * 13;
        let mut round_values = Vec::new();
        for t in strict_tasks {
            round_values.extend(t.await.unwrap());
        }
        assert!(!round_values.is_empty(), "strict calls ran");
        let distinct: HashSet<u64> = round_values.iter().copied().collect();
        assert_eq!(distinct.len(), round_values.len(), "strict values twice");
        assert!(
            round_values.iter().all(|v| *v > strict_max),
            "round {round}: a strict value at or below {strict_max} after a kill"
        );
        strict_max = *round_values.iter().max().unwrap();
    }
    assert_eq!(seen_lease.len(), lease_total);
}
