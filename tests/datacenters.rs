//! Datacenter ids across Consul datacenters (rule 39), end to end: real
//! `idgen serve` processes against two emulated Consul datacenters, `dc1`
//! (the primary) and `dc2`. A datacenter id is claimed once, in the
//! primary's KV; a node of another Consul datacenter with the same id
//! refuses to start, and a running one whose claim turns out to be another
//! datacenter's fences at its next mark renewal.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{write_cluster_config, ChildServer};
use consul_testserver::TestConsul;

/// A node of `consul` (one datacenter's agent) with `datacenter_id`.
fn config(dir: &Path, name: &str, consul: &TestConsul, datacenter_id: u64) -> PathBuf {
    let id = datacenter_id.to_string();
    write_cluster_config(
        dir,
        name,
        consul.addr(),
        &[
            ("node", "datacenter_id", &id),
            ("consul", "primary_datacenter", "\"dc1\""),
        ],
    )
}

/// The claim record of `id` as `consul` (one datacenter) holds it.
fn claim(consul: &TestConsul, id: u64) -> Option<String> {
    consul
        .kv_get(&format!("idgen/test/datacenters/{id}"))
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
}

/// `dc1` and `dc2`, `dc1` the primary.
async fn federation() -> (TestConsul, TestConsul) {
    let dc1 = common::test_consul().await;
    let dc2 = dc1.add_datacenter("dc2").await.expect("dc2 starts");
    (dc1, dc2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datacenter_id_owned_by_another_consul_datacenter_is_refused_and_distinct_ids_never_repeat(
) {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let a1 = ChildServer::start(&config(dir.path(), "a1", &dc1, 1));
    let a2 = ChildServer::start(&config(dir.path(), "a2", &dc1, 1));
    let record = claim(&dc1, 1).expect("the first node claims its id in the primary");
    assert!(record.contains("\"consul_datacenter\":\"dc1\""), "{record}");
    assert!(record.contains("\"cluster\":\"test\""), "{record}");

    // dc2 deployed from a copy of dc1's config: same datacenter id.
    for name in ["b1", "b2"] {
        let log = ChildServer::try_start(&config(dir.path(), name, &dc2, 1), &[])
            .err()
            .expect("a second Consul datacenter with the same id must be refused")
            .replace('\\', ""); // JSON or plain text alike
        assert!(
            log.contains("datacenter id 1 belongs to Consul datacenter \"dc1\""),
            "{log}"
        );
        assert!(log.contains("Consul datacenter \"dc2\""), "{log}");
        assert!(log.contains("node.datacenter_id of their own"), "{log}");
    }
    assert!(
        dc2.sessions().is_empty(),
        "a refused node takes no worker id"
    );

    // With an id of its own, dc2's nodes serve; the claim lives in the
    // primary only.
    let b1 = ChildServer::start(&config(dir.path(), "b1", &dc2, 2));
    let b2 = ChildServer::start(&config(dir.path(), "b2", &dc2, 2));
    let record = claim(&dc1, 2).expect("dc2's id is claimed in the primary");
    assert!(record.contains("\"consul_datacenter\":\"dc2\""), "{record}");
    assert_eq!(claim(&dc2, 2), None, "no claim in dc2's own KV");

    let mut seen = HashSet::new();
    for _ in 0..10 {
        for node in [&a1, &a2, &b1, &b2] {
            for id in common::snowflake_ids(node, 1000).await.expect("issues") {
                assert!(seen.insert(id), "ID {id} handed out twice");
            }
        }
    }
    assert_eq!(seen.len(), 40_000);
    for node in [a1, a2, b1, b2] {
        assert!(node.terminate().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_node_whose_claim_is_another_datacenters_fences_at_its_next_mark_renewal() {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    common::snowflake_ids(&b, 10).await.expect("serves");
    // The claim now names dc1 (as if dc1 had claimed id 2 while dc2's
    // claim was gone): dc2's node must stop at its next mark renewal.
    let key = "idgen/test/datacenters/2";
    let taken = r#"{"consul_datacenter":"dc1","cluster":"test","claimed_ms":1,"claimed_by":"x"}"#;
    let put = reqwest::Client::new()
        .put(format!("http://{}/v1/kv/{key}", dc1.addr()))
        .body(taken)
        .send()
        .await
        .expect("rewrite the claim");
    assert_eq!(put.status().as_u16(), 200);
    // Fenced at the next mark renewal (every second), then refused with
    // the reason once its claim again is refused.
    let mut refusal = None;
    for _ in 0..300 {
        match common::snowflake_ids(&b, 1).await {
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                refusal = Some(s);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let s = refusal.unwrap_or_else(|| panic!("not fenced with the reason: {}", b.log_text()));
    let why = s.message();
    assert!(
        why.contains("datacenter id 2 belongs to Consul datacenter \"dc1\""),
        "{why}"
    );
    assert!(why.contains("Consul datacenter \"dc2\""), "{why}");
    assert!(b.log_text().contains("high-water mark not written"));
    b.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datacenter_on_another_layout_than_the_primarys_is_refused() {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ChildServer::start(&config(dir.path(), "a", &dc1, 1));
    // dc2 has no layout record of its own yet: without the primary's, it
    // would record this one and issue on it.
    let log = ChildServer::try_start_env(
        &config(dir.path(), "b", &dc2, 2),
        &[],
        &[("IDGEN_LAYOUT__EPOCH", "2024-01-01T01:00:00Z")],
    )
    .err()
    .expect("a layout other than the primary's must be refused");
    assert!(
        log.contains("layout.epoch: cluster has 2024-01-01T00:00:00Z"),
        "{log}"
    );
    assert!(
        dc2.sessions().is_empty(),
        "a refused node takes no worker id"
    );
    // The same layout starts, and the primary holds the one record.
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    assert!(dc1.kv_get("idgen/test/layout").is_some());
    for node in [a, b] {
        assert!(node.terminate().success());
    }
}

/// The node's `/metrics` exposition.
async fn metrics_text(node: &ChildServer) -> String {
    reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics body")
}

/// Rule 42: the primary down, a datacenter whose claim the primary
/// confirmed restarts and serves on the copy in its own KV; a first claim
/// (a new datacenter, or a new id in this one) is refused naming the
/// primary; the primary back, claims resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_claim_outlives_a_primary_outage_and_a_first_claim_waits_for_the_primary() {
    let (dc1, dc2) = federation().await;
    let dc3 = dc1.add_datacenter("dc3").await.expect("dc3 starts");
    let dir = tempfile::tempdir().unwrap();
    let a = ChildServer::start(&config(dir.path(), "a", &dc1, 1));
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    let copy = dc2
        .kv_get("idgen/test/datacenter-confirmed/2")
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .expect("the confirmed claim is copied into dc2's own KV");
    assert!(copy.contains("\"consul_datacenter\":\"dc2\""), "{copy}");
    assert!(copy.contains("\"primary\":\"dc1\""), "{copy}");
    let mut seen: HashSet<u64> = HashSet::new();
    for id in common::snowflake_ids(&b, 1000).await.expect("issues") {
        assert!(seen.insert(id));
    }
    assert!(b.terminate().success());

    dc1.faults().datacenter_down(true);
    // dc2 restarts on its confirmed copy and keeps renewing its marks on
    // it: five checks the primary did not answer, then still issuing.
    let b = ChildServer::start(&config(dir.path(), "b2", &dc2, 2));
    let mut unanswered = 0.0;
    for _ in 0..400 {
        let text = metrics_text(&b).await;
        assert_eq!(
            common::metric(&text, "idgen_datacenter_primary_reachable"),
            Some(0.0),
            "{text}"
        );
        unanswered = common::metric(&text, "idgen_datacenter_primary_unreachable_checks_total")
            .unwrap_or(0.0);
        if unanswered >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(unanswered >= 5.0, "{}", b.log_text());
    for id in common::snowflake_ids(&b, 1000)
        .await
        .expect("serves on the copy")
    {
        assert!(seen.insert(id), "ID {id} handed out twice");
    }
    let log = b.log_text().replace('\\', "");
    assert!(
        log.contains("the primary Consul datacenter \"dc1\" has been unreachable for"),
        "{log}"
    );

    // A first claim needs the primary: a new datacenter, and a new id in
    // dc2 (whose copy is of id 2 only).
    for (name, consul, id) in [("c", &dc3, 3), ("b3", &dc2, 4)] {
        let log = match ChildServer::try_start(&config(dir.path(), name, consul, id), &[]) {
            Ok(node) => panic!(
                "a first claim without the primary must be refused: {}",
                node.log_text()
            ),
            Err(log) => log.replace('\\', ""),
        };
        assert!(
            log.contains(&format!(
                "cannot reach the primary Consul datacenter \"dc1\" (consul.primary_datacenter) to claim datacenter id {id}"
            )),
            "{log}"
        );
        assert!(
            log.contains("a first claim of a datacenter id needs the primary"),
            "{log}"
        );
    }
    assert!(claim(&dc1, 3).is_none() && claim(&dc1, 4).is_none());

    // The primary back: dc3 claims its id; dc2's node confirms again.
    dc1.faults().datacenter_down(false);
    let c = ChildServer::start(&config(dir.path(), "c", &dc3, 3));
    let record = claim(&dc1, 3).expect("dc3's id is claimed once the primary is back");
    assert!(record.contains("\"consul_datacenter\":\"dc3\""), "{record}");
    let mut reachable = None;
    for _ in 0..400 {
        reachable = common::metric(
            &metrics_text(&b).await,
            "idgen_datacenter_primary_reachable",
        );
        if reachable == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(reachable, Some(1.0), "{}", b.log_text());
    for node in [&a, &b, &c] {
        for id in common::snowflake_ids(node, 1000).await.expect("issues") {
            assert!(seen.insert(id), "ID {id} handed out twice");
        }
    }
    for node in [a, b, c] {
        assert!(node.terminate().success());
    }
}
