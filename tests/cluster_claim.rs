//! Auto claim passes over a poisoned worker id (a stored high-water mark
//! far ahead of this node's clock) instead of refusing to start: real
//! `idgen serve` processes against the in-repo Consul test server.

mod common;

use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

use common::{default_layout, metric, write_cluster_config, ChildServer};
use consul_testserver::TestConsul;
use idgen::proto::{GenIdsRequest, Mode};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Writes a mark an hour ahead for `worker`, through the HTTP KV API, as
/// a node with a fast clock would have left it.
async fn poison(consul: &TestConsul, worker: u64) -> u64 {
    let mark = now_ms() + 3_600_000;
    let url = format!("http://{}/v1/kv/idgen/test/hwm/0/{worker}", consul.addr());
    let resp = reqwest::Client::new()
        .put(url)
        .body(mark.to_string())
        .send()
        .await
        .expect("kv put");
    assert!(resp.status().is_success());
    mark
}

async fn ids(node: &ChildServer, count: u32) -> Vec<u64> {
    let mut c = node.client().await;
    c.gen_ids(GenIdsRequest {
        mode: Mode::Snowflake as i32,
        tag: String::new(),
        count,
    })
    .await
    .expect("issues")
    .into_inner()
    .ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_claim_skips_a_poisoned_id_and_a_static_node_on_it_is_refused() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let mark = poison(&consul, 0).await;

    let node = ChildServer::start(&write_cluster_config(dir.path(), "a", consul.addr(), &[]));
    let layout = default_layout();
    let mut seen = HashSet::new();
    for _ in 0..3 {
        for id in ids(&node, 1000).await {
            let parts = layout.decompose(id).unwrap();
            assert_eq!(parts.worker, 1, "started on the next free id");
            assert!(parts.unix_ms < mark, "issues at its own clock");
            assert!(seen.insert(id), "ID {id} twice");
        }
    }
    let log = node.log_text();
    assert!(
        log.contains("gave it back, trying the next free id"),
        "{log}"
    );
    assert!(log.contains("\"worker\":\"0/0\""), "{log}");
    assert!(log.contains("skew_ms"), "{log}");
    let metrics = reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric(&metrics, "idgen_worker_ids_skipped_total"),
        Some(1.0)
    );
    // The poisoned id was given back, not kept under a session.
    let lock = consul.kv_get("idgen/test/workers/0/0").expect("lock key");
    assert_eq!(lock.session, None);

    // A static node asking for the poisoned id is still refused.
    let fixed = write_cluster_config(
        dir.path(),
        "fixed",
        consul.addr(),
        &[
            ("consul", "worker", "\"static\""),
            ("node", "worker_id", "0"),
        ],
    );
    let log = ChildServer::try_start(&fixed, &[])
        .err()
        .expect("static claim of a poisoned id must be refused");
    assert!(log.contains("behind the stored high-water mark"), "{log}");
    assert!(node.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_claim_fails_naming_the_ids_when_every_free_id_is_poisoned() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    // One worker bit: ids 0 and 1 only.
    for worker in [0, 1] {
        poison(&consul, worker).await;
    }
    let cfg = write_cluster_config(
        dir.path(),
        "a",
        consul.addr(),
        &[("layout", "worker_bits", "1")],
    );
    let log = ChildServer::try_start(&cfg, &[])
        .err()
        .expect("no usable id: start-up fails");
    assert!(log.contains("every free id ([0, 1])"), "{log}");
    assert!(log.contains("clock.max_startup_skew"), "{log}");
    assert!(consul.sessions().is_empty(), "nothing left held");
}
