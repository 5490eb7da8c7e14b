//! The client keeps ahead: several prefetch refills in flight at once,
//! spread over the nodes, and every guarantee of the buffer kept: no ID
//! handed out twice when refills race each other and a node dies under
//! them, and nothing repeated when a buffer is drained or dropped while
//! its refills are still on their way.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{all_modes_config, test_consul, write_cluster_config, ChildServer, TestServer};
use idgen_client::{Client, ConsulDiscovery, Mode, PrefetchConfig, Prefetcher};

/// Small batches and many lanes, so refills overlap all the time.
fn racing_refills() -> PrefetchConfig {
    PrefetchConfig {
        initial_batch: 50,
        min_batch: 20,
        max_batch: 200,
        refills_in_flight: 6,
        ..PrefetchConfig::default()
    }
}

/// The worker field of a default-layout snowflake ID.
fn worker_of(id: u64) -> u64 {
    (id >> 12) & 0x1f
}

/// Waits (at most 10 s) until Consul lists `n` passing idgen instances.
async fn wait_passing(consul: std::net::SocketAddr, n: usize) {
    let url = format!("http://{consul}/v1/health/service/idgen?passing");
    for _ in 0..200 {
        if let Ok(r) = reqwest::get(&url).await {
            let list: Vec<serde_json::Value> = r.json().await.unwrap_or_default();
            if list.len() == n {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("Consul did not list {n} passing idgen nodes");
}

/// Calls `next_id` on `p` from `tasks` tasks until `stop`; every ID and
/// every error, and the most refills seen in flight at once.
async fn draw(
    p: &Prefetcher,
    tasks: usize,
    stop: &Arc<AtomicBool>,
) -> (Vec<u64>, Vec<String>, u32) {
    draw_counting(p, tasks, stop, Arc::new(AtomicU32::new(0))).await
}

/// [`draw`], keeping the most refills seen in flight in `most` as it goes
/// (a test may wait on it).
async fn draw_counting(
    p: &Prefetcher,
    tasks: usize,
    stop: &Arc<AtomicBool>,
    most: Arc<AtomicU32>,
) -> (Vec<u64>, Vec<String>, u32) {
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (p, stop, most) = (p.clone(), Arc::clone(stop), Arc::clone(&most));
            tokio::spawn(async move {
                let (mut ids, mut errors) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    most.fetch_max(p.refills_in_flight(), Ordering::Relaxed);
                    match p.next_id().await {
                        Ok(id) => ids.push(id),
                        Err(e) => errors.push(e.to_string()),
                    }
                    if ids.len() % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                (ids, errors)
            })
        })
        .collect();
    let (mut all, mut errors) = (Vec::new(), Vec::new());
    for h in handles {
        let (ids, errs) = h.await.unwrap();
        all.extend(ids);
        errors.extend(errs);
    }
    (all, errors, most.load(Ordering::Relaxed))
}

fn assert_distinct(ids: &[u64], what: &str) -> HashSet<u64> {
    let mut seen = HashSet::with_capacity(ids.len());
    for id in ids {
        assert!(seen.insert(*id), "{what}: ID {id} handed out twice");
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refills_racing_over_three_nodes_never_repeat_an_id_when_one_node_dies() {
    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let segment = [
        ("segment", "enabled", "true"),
        ("segment", "auto_create", "true"),
        ("segment", "default_step", "100"),
    ];
    let mut nodes: Vec<ChildServer> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            ChildServer::start(&write_cluster_config(
                dir.path(),
                n,
                consul.addr(),
                &segment,
            ))
        })
        .collect();
    wait_passing(consul.addr(), 3).await;
    let client = Client::builder()
        .consul(
            ConsulDiscovery::new(format!("http://{}", consul.addr())).wait(Duration::from_secs(5)),
        )
        .deadline(Duration::from_secs(5))
        .set_aside(Duration::from_millis(300))
        .prefetch(racing_refills())
        .build()
        .await
        .unwrap();
    let snowflake = client.prefetcher(Mode::Snowflake, "").unwrap();
    let orders = client.prefetcher(Mode::Segment, "orders").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let runs = {
        let (s, o, stop) = (snowflake.clone(), orders.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let (a, b) = tokio::join!(draw(&s, 3, &stop), draw(&o, 3, &stop));
            (a, b)
        })
    };
    // Bounded by count: run until both buffers handed out IDs from every
    // node (at most 20 s), then kill one node under the load.
    let mut before = HashSet::new();
    for _ in 0..400 {
        before.insert(worker_of(client.gen_id(Mode::Snowflake, "").await.unwrap()));
        if before.len() == 3 && snowflake.batch_size() == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nodes.remove(0).kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let ((flakes, flake_errors, flake_lanes), (segs, seg_errors, seg_lanes)) = runs.await.unwrap();

    assert!(
        flake_errors.is_empty(),
        "snowflake errors: {flake_errors:?}"
    );
    assert!(seg_errors.is_empty(), "segment errors: {seg_errors:?}");
    assert!(
        flake_lanes > 1 && seg_lanes > 1,
        "refills overlapped (most in flight at once: snowflake {flake_lanes}, segment {seg_lanes})"
    );
    let seen = assert_distinct(&flakes, "snowflake");
    let workers: HashSet<u64> = seen.iter().map(|&id| worker_of(id)).collect();
    assert_eq!(workers.len(), 3, "refills went to every node: {workers:?}");
    assert!(flakes.len() > 2_000, "the load ran: {} IDs", flakes.len());
    let mut segs_all = segs;
    segs_all.extend(orders.drain());
    assert_distinct(&segs_all, "segment");
    assert!(
        segs_all.len() > 2_000,
        "the load ran: {} IDs",
        segs_all.len()
    );
    drop(nodes);
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_drained_or_dropped_with_refills_in_flight_repeats_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(all_modes_config(dir.path())).await;
    let builder = || {
        Client::builder()
            .endpoints([server.grpc.to_string()])
            .deadline(Duration::from_secs(10))
            .prefetch(racing_refills())
    };
    let first = builder().build().await.unwrap();
    let p = first.prefetcher(Mode::Segment, "dropped").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicU32::new(0));
    let run = {
        let (p, stop, most) = (p.clone(), Arc::clone(&stop), Arc::clone(&most));
        tokio::spawn(async move { draw_counting(&p, 4, &stop, most).await })
    };
    // Draw until the drawing tasks saw several refills at once (bounded:
    // 20 s). What this loop itself sees is another moment: waiting on it
    // once stopped the draw before the tasks had seen any overlap.
    for _ in 0..400 {
        if most.load(Ordering::Relaxed) > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut handed, errors, lanes) = run.await.unwrap();
    assert!(errors.is_empty(), "errors: {errors:?}");
    assert!(lanes > 1, "refills overlapped (most at once: {lanes})");
    // Drained while refills may still be on their way: what lands after
    // the drain is new, never something the drain already gave back.
    handed.extend(p.drain());
    for _ in 0..3 {
        handed.push(p.next_id().await.unwrap());
    }
    handed.extend(p.drain());
    // Dropped with refills in flight: their IDs are gaps. Another client
    // of the same tag gets none of what the first one handed out.
    let _ = p.next_id().await.unwrap();
    drop(p);
    drop(first);
    let second = builder().build().await.unwrap();
    let q = second.prefetcher(Mode::Segment, "dropped").unwrap();
    for _ in 0..2_000 {
        handed.push(q.next_id().await.unwrap());
    }
    assert_distinct(&handed, "drained, dropped and a second client");
    drop(q);
    drop(second);
    server.stop().await;
}
