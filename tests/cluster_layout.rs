//! The cluster's layout guard end to end: real `idgen serve` processes
//! against the in-repo Consul-compatible test server. A node with another
//! layout than the one recorded in Consul refuses to start; a layout
//! change through `idgen admin layout set` is refused when it could repeat
//! an ID, needs `--yes`, and once accepted fences the nodes still on the
//! old layout, naming the change in their refusals, `/readyz` and log.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{write_cluster_config, ChildServer};
use consul_testserver::TestConsul;

const TOKEN: &str = "layout-admin-secret";

fn config(dir: &Path, name: &str, consul: std::net::SocketAddr) -> std::path::PathBuf {
    let token = format!("\"{TOKEN}\"");
    write_cluster_config(dir, name, consul, &[("admin", "token", &token)])
}

/// `idgen admin` against `node` with the admin token.
async fn admin_cli(node: &ChildServer, args: &[&str]) -> (bool, String) {
    common::admin_cli(node, TOKEN, args).await
}

/// Collects IDs from `node` in batches, asserting none repeats in `seen`.
async fn collect(node: &ChildServer, batches: u32, seen: &mut HashSet<u64>) -> u64 {
    let mut max = 0;
    for _ in 0..batches {
        for id in common::snowflake_ids(node, 1000).await.expect("issues") {
            assert!(seen.insert(id), "ID {id} handed out twice");
            max = max.max(id);
        }
    }
    max
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_a_later_epoch_or_another_preset_is_refused_naming_the_field() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "a", consul.addr());
    let a = ChildServer::start(&cfg);
    let mut seen = HashSet::new();
    let before = collect(&a, 3, &mut seen).await;
    let record = consul
        .kv_get("idgen/test/layout")
        .expect("the first node records the layout");
    let text = String::from_utf8(record.value).unwrap();
    assert!(text.contains("\"preset\":\"twitter\""), "{text}");
    assert!(text.contains("\"epoch_ms\":1704067200000"), "{text}");
    assert!(a.terminate().success());

    // The epoch moved forward by an hour: this node's IDs would start far
    // below the ones just issued.
    let log = ChildServer::try_start_env(
        &cfg,
        &[],
        &[("IDGEN_LAYOUT__EPOCH", "2024-01-01T01:00:00Z")],
    )
    .err()
    .expect("a restart with another epoch must be refused");
    assert!(
        log.contains("layout.epoch: cluster has 2024-01-01T00:00:00Z"),
        "{log}"
    );
    assert!(log.contains("this node has 2024-01-01T01:00:00Z"), "{log}");
    assert!(log.contains("idgen admin layout set"), "{log}");

    // Another preset, on a second node of the same cluster.
    let other = write_cluster_config(
        dir.path(),
        "b",
        consul.addr(),
        &[("layout", "preset", "\"sonyflake\"")],
    );
    let log = ChildServer::try_start(&other, &[])
        .err()
        .expect("a node with another preset must be refused");
    assert!(
        log.contains("layout.preset: cluster has twitter, this node has sonyflake"),
        "{log}"
    );
    assert!(log.contains("layout.time_bits: cluster has 41"), "{log}");
    assert!(
        consul.sessions().is_empty(),
        "a refused node takes no worker id"
    );

    // The recorded layout still starts, above everything before.
    let a = ChildServer::start(&cfg);
    let after = collect(&a, 2, &mut seen).await;
    assert!(after > before);
    assert!(a.terminate().success());
}

/// `layout set ARGS` without `--yes`: refused, printing the procedure,
/// and the record is unchanged.
async fn refused_without_yes(node: &ChildServer, args: &[&str]) {
    let (ok, out) = admin_cli(node, args).await;
    assert!(!ok, "a layout change needs --yes: {out}");
    assert!(out.contains("maintenance procedure"), "{out}");
    assert!(out.contains("--yes"), "{out}");
    assert!(out.contains("restart each node"), "{out}");
    let (ok, out) = admin_cli(node, &["layout", "get"]).await;
    assert!(ok && out.contains("generation 1"), "unchanged: {out}");
}

/// A node fenced by the change from the 2024 epoch to the 2023 one says
/// so in its refusals (FAILED_PRECONDITION, not the lost-lease text),
/// `/readyz` and log.
async fn assert_fenced_naming_the_change(node: &ChildServer) {
    let s = common::snowflake_ids(node, 1)
        .await
        .expect_err("stays fenced");
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
    let why = s.message();
    assert!(why.contains("the cluster layout changed from"), "{why}");
    assert!(why.contains("epoch 2024-01-01T00:00:00Z"), "{why}");
    assert!(why.contains("to preset twitter"), "{why}");
    assert!(why.contains("2023-01-01T00:00:00Z"), "{why}");
    assert!(why.contains("idgen admin layout set` on node"), "{why}");
    assert!(
        why.contains("fenced until it restarts with layout"),
        "{why}"
    );
    assert!(!why.contains("lost its worker lock"), "{why}");
    let ready = reqwest::get(format!("http://{}/readyz", node.http))
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let body = ready.text().await.unwrap();
    assert!(body.contains("the cluster layout changed from"), "{body}");
    let log = node.log_text();
    assert!(log.contains("the cluster layout record"), "{log}");
    assert!(log.contains("fenced: the cluster layout changed"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_change_is_refused_when_ids_could_repeat_and_once_accepted_fences_old_nodes() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg_a = config(dir.path(), "a", consul.addr());
    let cfg_b = config(dir.path(), "b", consul.addr());
    let a = ChildServer::start(&cfg_a);
    let b = ChildServer::start(&cfg_b);
    let mut seen = HashSet::new();
    let mut old_max = collect(&a, 3, &mut seen).await;
    old_max = old_max.max(collect(&b, 3, &mut seen).await);

    let (ok, out) = admin_cli(&a, &["layout", "get"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("generation 1") && out.contains("preset twitter"),
        "{out}"
    );

    // An epoch an hour later: its IDs would lie far below the ones issued.
    let (ok, out) = admin_cli(
        &a,
        &[
            "layout",
            "set",
            "--preset",
            "twitter",
            "--epoch",
            "2024-01-01T01:00:00Z",
            "--yes",
        ],
    )
    .await;
    assert!(!ok, "an unsafe change must be refused: {out}");
    assert!(out.contains("FAILED_PRECONDITION"), "{out}");
    assert!(out.contains("layout change refused"), "{out}");
    // Refused before anything was touched: both nodes keep issuing.
    old_max = old_max.max(collect(&a, 1, &mut seen).await);
    old_max = old_max.max(collect(&b, 1, &mut seen).await);

    // A read-then-write against a generation that is not current loses.
    let (ok, out) = admin_cli(
        &a,
        &[
            "layout",
            "set",
            "--preset",
            "twitter",
            "--epoch",
            "2023-01-01T00:00:00Z",
            "--expect-generation",
            "7",
            "--i-understand-this-fences",
        ],
    )
    .await;
    assert!(!ok && out.contains("ABORTED"), "{out}");

    // An epoch a year earlier: every new ID lies above every old one. It
    // fences every running node, so without the confirmation the command
    // prints the procedure and changes nothing.
    let safe = [
        "layout",
        "set",
        "--preset",
        "twitter",
        "--epoch",
        "2023-01-01T00:00:00Z",
    ];
    refused_without_yes(&a, &safe).await;
    old_max = old_max.max(collect(&a, 1, &mut seen).await);
    // Accepted: docs/OPERATIONS.md's command as written ("Changing the cluster
    // layout", step 2): the widths restated, the generation `layout get`
    // showed.
    let widths = [
        "--time-unit",
        "1ms",
        "--time-bits",
        "41",
        "--datacenter-bits",
        "5",
        "--worker-bits",
        "5",
        "--sequence-bits",
        "12",
        "--expect-generation",
        "1",
        "--yes",
    ];
    let (ok, out) = admin_cli(&a, &[&safe[..], &widths[..]].concat()).await;
    assert!(ok, "a safe change must be accepted: {out}");
    assert!(out.contains("layout changed"), "{out}");
    assert!(out.contains("restart every node"), "{out}");

    // Both nodes still run the old layout: they stop issuing within a
    // mark renewal or two, and stay stopped, saying why: the layout
    // changed (FAILED_PRECONDITION), not a lost lease.
    for node in [&a, &b] {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            match common::snowflake_ids(node, 100).await {
                Ok(got) => {
                    for id in got {
                        assert!(seen.insert(id), "ID {id} handed out twice");
                        old_max = old_max.max(id);
                    }
                }
                Err(s) if s.code() == tonic::Code::FailedPrecondition => break,
                // Between the fence and the record read that names it.
                Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
            }
            assert!(
                Instant::now() < end,
                "an old-layout node kept issuing or never named the change"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for node in [&a, &b] {
        assert_fenced_naming_the_change(node).await;
    }
    assert!(a.terminate().success());
    assert!(b.terminate().success());

    // A restart on the old layout is refused, naming the epoch.
    let log = ChildServer::try_start(&cfg_a, &[])
        .err()
        .expect("the old layout must be refused after the change");
    assert!(
        log.contains("layout.epoch: cluster has 2023-01-01T00:00:00Z"),
        "{log}"
    );

    // On the new layout both start, and every new ID is above every old one.
    let new_epoch = [("IDGEN_LAYOUT__EPOCH", "2023-01-01T00:00:00Z")];
    let a = ChildServer::try_start_env(&cfg_a, &[], &new_epoch).expect("new layout starts");
    let b = ChildServer::try_start_env(&cfg_b, &[], &new_epoch).expect("new layout starts");
    for node in [&a, &b] {
        for _ in 0..3 {
            for id in common::snowflake_ids(node, 1000).await.expect("issues") {
                assert!(id > old_max, "new ID {id} not above old {old_max}");
                assert!(seen.insert(id), "ID {id} handed out twice");
            }
        }
    }
    let (ok, out) = admin_cli(&a, &["layout", "get"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("generation 3"), "{out}");
    assert!(out.contains("earlier: generation 1"), "{out}");
    assert!(a.terminate().success());
    assert!(b.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_first_nodes_with_different_layouts_leave_one_record_and_one_refusal() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let twitter = write_cluster_config(dir.path(), "t", consul.addr(), &[]);
    let sony = write_cluster_config(
        dir.path(),
        "s",
        consul.addr(),
        &[("layout", "preset", "\"sonyflake\"")],
    );
    // Started together: whichever records first, the other must compare
    // against that record and refuse.
    let (a, b) = tokio::join!(
        tokio::task::spawn_blocking(move || ChildServer::try_start(&twitter, &[])),
        tokio::task::spawn_blocking(move || ChildServer::try_start(&sony, &[])),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(
        a.is_ok() != b.is_ok(),
        "exactly one of two layouts may start: twitter {:?}, sonyflake {:?}",
        a.as_ref().err(),
        b.as_ref().err()
    );
    let record = String::from_utf8(consul.kv_get("idgen/test/layout").unwrap().value).unwrap();
    let (winner, refusal) = match (a, b) {
        (Ok(node), Err(log)) => (("twitter", node), log),
        (Err(log), Ok(node)) => (("sonyflake", node), log),
        _ => unreachable!(),
    };
    assert!(
        record.contains(&format!("\"preset\":\"{}\"", winner.0)),
        "{record}"
    );
    assert!(refusal.contains("layout.preset: cluster has"), "{refusal}");
    assert!(winner.1.terminate().success());
}

/// Rewrites the layout record through the HTTP KV API as an interrupted
/// `admin layout set` would have left it: marked changing at `marked_ms`.
async fn mark_changing(consul: &TestConsul, marked_ms: u64) -> u64 {
    let entry = consul.kv_get("idgen/test/layout").expect("a record");
    let mut record: serde_json::Value = serde_json::from_slice(&entry.value).unwrap();
    let generation = record["generation"].as_u64().unwrap() + 1;
    let mut to = record["layout"].clone();
    to["epoch_ms"] = serde_json::json!(1_672_531_200_000u64);
    record["changing_to"] = to;
    record["generation"] = serde_json::json!(generation);
    record["recorded_ms"] = serde_json::json!(marked_ms);
    let url = format!("http://{}/v1/kv/idgen/test/layout", consul.addr());
    let resp = reqwest::Client::new()
        .put(url)
        .body(record.to_string())
        .send()
        .await
        .expect("kv put");
    assert!(resp.status().is_success());
    generation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_change_holds_nodes_off_then_is_rolled_back() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "a", consul.addr());
    let a = ChildServer::start(&cfg);
    let mut seen = HashSet::new();
    let before = collect(&a, 2, &mut seen).await;
    assert!(a.terminate().success());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;

    // Just marked: nobody starts while the change is being checked.
    mark_changing(&consul, now).await;
    let log = ChildServer::try_start(&cfg, &[])
        .err()
        .expect("no node starts during a change");
    assert!(log.contains("is being changed"), "{log}");

    // Marked two minutes ago and never finished: the next node puts the
    // layout in force back and starts on it.
    let marked = mark_changing(&consul, now - 120_000).await;
    let a = ChildServer::start(&cfg);
    assert!(a.log_text().contains("never finished"), "{}", a.log_text());
    let after = collect(&a, 2, &mut seen).await;
    assert!(after > before);
    let record: serde_json::Value =
        serde_json::from_slice(&consul.kv_get("idgen/test/layout").unwrap().value).unwrap();
    assert_eq!(record["generation"].as_u64(), Some(marked + 1));
    assert!(record.get("changing_to").is_none(), "{record}");
    assert_eq!(
        record["layout"]["epoch_ms"].as_u64(),
        Some(1_704_067_200_000)
    );
    assert!(a.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_admin_calls_on_the_embedded_store_say_where_the_layout_lives() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("[admin]\ntoken = \"{TOKEN}\"\n"));
    std::fs::write(&path, text).unwrap();
    let node = ChildServer::start(&path);
    for args in [
        &["layout", "get"][..],
        &[
            "layout",
            "set",
            "--preset",
            "twitter",
            "--epoch",
            "2023-01-01T00:00:00Z",
            "--yes",
        ][..],
    ] {
        let (ok, out) = admin_cli(&node, args).await;
        assert!(!ok, "{out}");
        assert!(out.contains("FAILED_PRECONDITION"), "{out}");
        assert!(out.contains("embedded store"), "{out}");
    }
    assert!(node.terminate().success());
}
