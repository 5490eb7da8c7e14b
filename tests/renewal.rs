//! Renewals cannot starve: a node whose request runtime is saturated
//! (every worker thread blocked, for longer than the session TTL and the
//! mark's reserve) keeps its high-water mark ahead of the clock and its
//! Consul session, because both are renewed on the node's own renewal
//! thread. In-process nodes, so the test can block their runtime; the
//! Consul test server runs on a runtime of its own.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{test_config, write_cluster_config};
use idgen::config::{Config, Overrides};
use idgen::id::{Mode, SystemClock};
use tokio::runtime::Runtime;

/// Worker threads of the node's (request) runtime.
const WORKERS: usize = 2;
/// How long every thread of the request runtime stays blocked: three
/// times the test session TTL (2 s), twice the mark's reserve (3 s).
const BLOCK: Duration = Duration::from_secs(6);
/// How much longer the worker threads stay blocked than the test thread.
const OVERHANG: Duration = Duration::from_secs(1);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn request_runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap()
}

/// Blocks every worker thread of the current runtime and the calling
/// thread for [`BLOCK`], the way CPU-bound or blocking handlers would;
/// returns once the calling thread's block ends, while the workers stay
/// blocked for another [`OVERHANG`] (so what the caller reads then was
/// written while the request runtime could run nothing).
async fn saturate() -> Vec<tokio::task::JoinHandle<()>> {
    let started = Arc::new(AtomicUsize::new(0));
    let blockers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let started = Arc::clone(&started);
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(BLOCK + OVERHANG);
            })
        })
        .collect();
    // Bounded: both workers picked a blocker up.
    for _ in 0..500 {
        if started.load(Ordering::SeqCst) == WORKERS {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        started.load(Ordering::SeqCst),
        WORKERS,
        "every worker blocked"
    );
    std::thread::sleep(BLOCK);
    blockers
}

#[test]
fn a_saturated_request_runtime_keeps_its_mark_and_its_consul_session() {
    let consul_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let consul = consul_rt.block_on(common::test_consul());
    let dir = tempfile::tempdir().unwrap();
    let path = write_cluster_config(dir.path(), "busy", consul.addr(), &[]);
    let config = Config::load(Some(&path), &Overrides::default(), now_ms()).expect("config");
    let layout = config.layout;

    request_runtime().block_on(async {
        let node = common::start_node(config, Arc::new(SystemClock)).await;
        let issuer = Arc::clone(&node.issuer);
        let first = issuer.gen_id(Mode::Snowflake, "").await.expect("issues");
        let worker = layout.decompose(first).unwrap().worker;
        let sessions: Vec<String> = consul.sessions().into_iter().map(|s| s.id).collect();
        assert_eq!(sessions.len(), 1);

        let blockers = saturate().await;
        // Read before the request runtime gets a chance to run anything.
        let now = now_ms();
        let entry = consul
            .kv_get(&format!("idgen/test/hwm/0/{worker}"))
            .expect("a stored mark");
        let mark: u64 = String::from_utf8(entry.value).unwrap().parse().unwrap();
        let alive: Vec<String> = consul.sessions().into_iter().map(|s| s.id).collect();
        assert!(
            mark >= now,
            "the stored mark {mark} fell behind the clock {now}: mark renewals starved"
        );
        assert_eq!(alive, sessions, "the session must survive the saturation");
        for b in blockers {
            b.await.unwrap();
        }

        assert!(!issuer.is_fenced(), "never fenced");
        let generator = issuer.generator();
        assert!(!generator.is_closed());
        assert!(generator.hwm_ms() >= now, "the generator's mark kept up");
        let next = issuer
            .gen_id(Mode::Snowflake, "")
            .await
            .expect("still issuing");
        assert!(next > first);
        assert_eq!(
            layout.decompose(next).unwrap().worker,
            worker,
            "same worker id"
        );
        let report = node.stop().await;
        assert!(report.final_hwm_ms.is_some(), "still held at shutdown");
    });
}

#[test]
fn a_saturated_request_runtime_keeps_its_embedded_mark_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path());
    request_runtime().block_on(async {
        let node = common::start_node(config, Arc::new(SystemClock)).await;
        let issuer = Arc::clone(&node.issuer);
        let first = issuer.gen_id(Mode::Snowflake, "").await.expect("issues");
        let blockers = saturate().await;
        let now = now_ms();
        let mark = issuer.generator().hwm_ms();
        assert!(
            mark >= now,
            "the mark {mark} fell behind the clock {now}: mark renewals starved"
        );
        for b in blockers {
            b.await.unwrap();
        }
        let next = issuer
            .gen_id(Mode::Snowflake, "")
            .await
            .expect("still issuing");
        assert!(next > first);
        node.stop().await;
    });
}
