//! The idgen-client crate falling back to another Consul datacenter
//! (`ConsulDiscovery::fallback_datacenters`): real `idgen serve` processes
//! in two emulated Consul datacenters, `dc1` (local to the client, the
//! primary) and `dc2`, a node in each with its own `node.datacenter_id`.
//! Every node of `dc1` killed under load: snowflake calls go on through
//! `dc2` with no error and no duplicate; strict and segment calls are
//! refused there (their counters are per datacenter) unless the client
//! opted in; `dc1`'s node back: calls return to it. The same through
//! the CLI: `idgen gen --discover consul --fallback-datacenter dc2`.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{write_datacenter_config, ChildServer};
use consul_testserver::TestConsul;
use idgen_client::{Client, ConsulDiscovery, Error, Mode, PrefetchConfig};

/// The datacenter field of a default-layout snowflake ID.
fn datacenter_of(id: u64) -> u64 {
    (id >> 17) & 0x1f
}

/// A node of `consul` (one datacenter's agent) with `datacenter_id`,
/// strict and segment mode on.
fn config(dir: &Path, name: &str, consul: &TestConsul, datacenter_id: u64) -> PathBuf {
    write_datacenter_config(
        dir,
        name,
        consul.addr(),
        datacenter_id,
        &[
            ("strict", "enabled", "true"),
            ("segment", "enabled", "true"),
            ("segment", "auto_create", "true"),
        ],
    )
}

/// Passing `idgen` instances the agent at `agent` lists in its datacenter.
async fn passing(agent: SocketAddr) -> usize {
    let url = format!("http://{agent}/v1/health/service/idgen?passing");
    match reqwest::get(url).await {
        Ok(r) => r
            .json::<Vec<serde_json::Value>>()
            .await
            .map_or(0, |v| v.len()),
        Err(_) => 0,
    }
}

/// Waits (at most 10 s) until the datacenter of `agent` lists `n` passing
/// instances.
async fn wait_passing(agent: SocketAddr, n: usize) {
    for _ in 0..200 {
        if passing(agent).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("Consul at {agent} did not list {n} passing idgen nodes");
}

/// Waits (at most 20 s) until the client uses exactly `node`.
async fn wait_nodes(client: &Client, node: SocketAddr) {
    for _ in 0..400 {
        if client.nodes() == vec![node.to_string()] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the client uses {:?}, not [{node}]", client.nodes());
}

/// A client of `dc1`'s agent falling back to `dc2`.
async fn client(dc1: &TestConsul, counters_may_cross: bool) -> Client {
    Client::builder()
        .consul(
            ConsulDiscovery::new(format!("http://{}", dc1.addr()))
                .wait(Duration::from_secs(5))
                .fallback_datacenters(["dc2"])
                .fallback_recheck(Duration::from_millis(500))
                .counters_may_cross_datacenters(counters_may_cross),
        )
        .deadline(Duration::from_secs(8))
        .set_aside(Duration::from_millis(300))
        .prefetch(PrefetchConfig {
            initial_batch: 100,
            min_batch: 50,
            ..PrefetchConfig::default()
        })
        .build()
        .await
        .expect("client starts")
}

/// Snowflake IDs through `next_id` (prefetched) and `gen_id` from 4 tasks
/// until `stop`: the IDs and every error.
fn load(
    client: &Client,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(Vec<u64>, Vec<String>)>> {
    (0..4)
        .map(|t| {
            let (client, stop) = (client.clone(), Arc::clone(stop));
            tokio::spawn(async move {
                let (mut ids, mut errors) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let got = if t % 2 == 0 {
                        client.next_id(Mode::Snowflake, "").await
                    } else {
                        client.gen_id(Mode::Snowflake, "").await
                    };
                    match got {
                        Ok(id) => ids.push(id),
                        Err(e) => errors.push(e.to_string()),
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                (ids, errors)
            })
        })
        .collect()
}

/// Asserts `result` is the refusal to take a counter's value from `dc2`.
fn assert_refused<T: std::fmt::Debug>(result: Result<T, Error>, counter: &str) {
    let err = result.expect_err("a counter's value must not come from the fallback datacenter");
    assert!(matches!(err, Error::CrossesDatacenters { .. }), "{err:?}");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let text = err.to_string();
    for words in [
        counter,
        "the local Consul datacenter \"dc1\" has no passing idgen node",
        "fallback datacenter \"dc2\"",
        "counters_may_cross_datacenters",
    ] {
        assert!(text.contains(words), "{words:?} missing from: {text}");
    }
}

/// Two emulated Consul datacenters, `dc1` (the primary) and `dc2`, a
/// passing node in each (datacenter ids 1 and 2), and their directory.
async fn two_datacenters() -> (
    TestConsul,
    TestConsul,
    tempfile::TempDir,
    ChildServer,
    ChildServer,
) {
    let dc1 = common::test_consul().await;
    let dc2 = dc1.add_datacenter("dc2").await.expect("dc2 starts");
    let dir = tempfile::tempdir().unwrap();
    let a = ChildServer::start(&config(dir.path(), "a", &dc1, 1));
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    wait_passing(dc1.addr(), 1).await;
    wait_passing(dc2.addr(), 1).await;
    (dc1, dc2, dir, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_local_datacenter_gone_snowflake_calls_go_on_through_the_fallback_and_counters_stay_home(
) {
    let (dc1, dc2, dir, a, b) = two_datacenters().await;

    let client = client(&dc1, false).await;
    let crossing = client_opted_in(&dc1).await;
    assert_eq!(client.nodes(), vec![a.grpc.to_string()], "local first");
    let strict_before = client
        .gen_id(Mode::Strict, "seats/a1")
        .await
        .expect("strict on the local datacenter");

    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&client, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.kill();
    wait_nodes(&client, b.grpc).await;
    // A while on the fallback datacenter under load.
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Strict and segment values are counted per datacenter: refused, and
    // never sent; with the opt-in they go through.
    assert_refused(
        client.gen_id(Mode::Strict, "seats/a1").await,
        "strict key \"seats/a1\"",
    );
    assert_refused(
        client.gen_ids(Mode::Segment, "orders", 3).await,
        "segment tag \"orders\"",
    );
    assert_refused(
        client.next_id(Mode::Segment, "orders").await,
        "segment tag \"orders\"",
    );
    wait_nodes(&crossing, b.grpc).await;
    crossing
        .gen_id(Mode::Strict, "seats/a1")
        .await
        .expect("strict crosses when the user opted in");

    // The local node back: calls return to it.
    let a = ChildServer::start(&config(dir.path(), "a", &dc1, 1));
    wait_nodes(&client, a.grpc).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut all, mut errors) = (Vec::new(), Vec::new());
    for t in tasks {
        let (ids, errs) = t.await.unwrap();
        all.extend(ids);
        errors.extend(errs);
    }
    assert!(errors.is_empty(), "the application saw errors: {errors:?}");
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "an ID was handed out twice");
    let dcs: HashSet<u64> = all.iter().map(|id| datacenter_of(*id)).collect();
    assert_eq!(dcs, HashSet::from([1, 2]), "IDs from both datacenters");
    for _ in 0..20 {
        let id = client
            .gen_id(Mode::Snowflake, "")
            .await
            .expect("local again");
        assert_eq!(datacenter_of(id), 1, "back on the local datacenter");
        assert!(!distinct.contains(&id));
    }
    let strict_after = client
        .gen_id(Mode::Strict, "seats/a1")
        .await
        .expect("strict on the local datacenter again");
    assert!(strict_after > strict_before);
    drop((a, b));
    dc2.shutdown().await;
    dc1.shutdown().await;
}

/// The client that opted in to counters crossing datacenters.
async fn client_opted_in(dc1: &TestConsul) -> Client {
    client(dc1, true).await
}

/// `idgen gen --discover consul --fallback-datacenter dc2` with `dc1`'s
/// only node killed: the IDs come from `dc2`'s node (datacenter id 2);
/// a misspelt datacenter is refused naming the known ones; without the
/// flag the command fails, knowing no node; a strict
/// call through the fallback is refused before sending, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_falls_back_to_another_datacenter_when_asked() {
    let (dc1, dc2, _dir, a, b) = two_datacenters().await;
    a.kill();
    wait_passing(dc1.addr(), 0).await;
    let consul = dc1.addr().to_string();
    let gen = |extra: &'static [&'static str]| {
        let consul = consul.clone();
        tokio::task::spawn_blocking(move || {
            let mut args = vec!["gen", "--discover", "consul", "--consul", &consul];
            args.extend_from_slice(extra);
            common::run_idgen(&args)
        })
    };
    let (ok, out) = gen(&["-n", "5", "--fallback-datacenter", "dc2"])
        .await
        .unwrap();
    assert!(ok, "{out}");
    let ids: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(ids.len(), 5, "{out}");
    assert!(ids.iter().all(|id| datacenter_of(*id) == 2), "{out}");

    // A misspelt fallback is refused at start-up, naming the ones there are.
    let (ok, out) = gen(&["-n", "5", "--fallback-datacenter", "DC2"])
        .await
        .unwrap();
    assert!(!ok, "{out}");
    assert!(
        out.contains(r#"fallback datacenter(s) ["DC2"] unknown to the Consul agent, which knows ["dc1", "dc2"]"#),
        "{out}"
    );

    let (ok, out) = gen(&["-n", "5"]).await.unwrap();
    assert!(!ok, "no passing local node and no fallback: {out}");
    assert!(out.contains("no idgen node is known"), "{out}");

    let (ok, out) = gen(&[
        "--mode",
        "strict",
        "--tag",
        "seats/a1",
        "--fallback-datacenter",
        "dc2",
    ])
    .await
    .unwrap();
    assert!(!ok, "strict does not cross: {out}");
    assert!(out.contains("counters_may_cross_datacenters"), "{out}");
    drop(b);
    dc2.shutdown().await;
    dc1.shutdown().await;
}
