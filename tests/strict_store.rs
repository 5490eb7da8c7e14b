//! Strict counters in Consul: values from several nodes never repeat and
//! strictly increase per caller, lost races end in success or
//! `Contended` (never a duplicate), an unreachable Consul fails a call at
//! once, and a bad stored value is an error naming the key.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_linearizable, consul, Call};
use consul_testserver::{Config, Policy, TestConsul};
use idgen::consul::{ConsulClient, ConsulConfig, KvWrite};
use idgen::id::strict::{Namespace, StrictKey, Values};
use idgen::store::kv_paths::ClusterPaths;
use idgen::store::strict::{ConsulStrictStore, StrictStore, MAX_STRICT_ATTEMPTS};
use idgen::store::StoreError;

fn key(s: &str) -> StrictKey {
    StrictKey::parse(s).unwrap()
}

fn ns(s: &str) -> Namespace {
    Namespace::parse(s).unwrap()
}

fn keys() -> ClusterPaths {
    ClusterPaths::new("idgen", "test")
}

/// `n` stores, each with its own client (like `n` nodes).
fn nodes(consul: &TestConsul, n: usize) -> Vec<Arc<ConsulStrictStore>> {
    (0..n)
        .map(|_| {
            Arc::new(ConsulStrictStore::new(
                consul::client(consul, Duration::from_secs(5), 0),
                keys(),
            ))
        })
        .collect()
}

/// What one caller got, call after call.
type Calls = Vec<Result<Values, StoreError>>;

/// `tasks` callers per node, `calls` calls each, on `k`.
async fn hammer(
    nodes: &[Arc<ConsulStrictStore>],
    k: &StrictKey,
    step: u64,
    tasks: usize,
    calls: usize,
) -> Vec<Calls> {
    let mut handles = Vec::new();
    for node in nodes {
        for t in 0..tasks {
            let (node, k) = (Arc::clone(node), k.clone());
            handles.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for c in 0..calls {
                    let count = 1 + ((t + c) % 3) as u64;
                    got.push(node.advance(&k, step, count).await);
                }
                got
            }));
        }
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// Checks every caller's values strictly increase and no value appears
/// twice anywhere; returns every value, sorted, and how many calls were
/// `Contended` (any other error fails the test).
fn check_calls(k: &StrictKey, callers: &[Calls]) -> (Vec<u64>, usize) {
    let mut all = Vec::new();
    let mut contended = 0;
    for calls in callers {
        let mut last_seen = 0;
        for call in calls {
            match call {
                Ok(v) => {
                    assert!(v.first > last_seen, "{v:?} after {last_seen}");
                    assert_eq!(v.last, v.first + (v.count() - 1) * v.step);
                    last_seen = v.last;
                    all.extend(v.iter());
                }
                Err(StoreError::Contended(msg)) => {
                    assert!(msg.contains(k.as_str()), "{msg}");
                    contended += 1;
                }
                Err(e) => panic!("unexpected error: {e:?}"),
            }
        }
    }
    let n = all.len();
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), n, "a value was handed out twice");
    (distinct.into_iter().collect(), contended)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_hand_out_distinct_increasing_values() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let nodes = nodes(&consul, 3);
    let k = key("chats/room-1");
    assert_eq!(nodes[0].current(&k).await.unwrap(), 0);
    let callers = hammer(&nodes, &k, 1, 16, 8).await;
    let (values, contended) = check_calls(&k, &callers);
    let calls = 3 * 16 * 8;
    // One local turn per key leaves three racers: losing 16 times in a
    // row is possible but must stay rare.
    assert!(contended * 20 <= calls, "{contended} of {calls} contended");
    // No write had an unknown outcome, so there are no gaps either.
    let max = *values.last().unwrap();
    assert_eq!(values, (1..=max).collect::<Vec<_>>());
    for node in &nodes {
        assert_eq!(node.current(&k).await.unwrap(), max);
    }
    let stored = consul.kv_get("idgen/test/strict/chats/room-1").unwrap();
    assert_eq!(stored.value, max.to_string().into_bytes());
    println!(
        "three nodes: {} values, {contended} of {calls} calls contended",
        values.len()
    );
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_storm_ends_in_values_or_contended_never_duplicates() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    // Eight nodes on one key, with a step: many lose races many times.
    let nodes = nodes(&consul, 8);
    let k = key("orders/hot");
    let callers = hammer(&nodes, &k, 7, 6, 6).await;
    let (values, contended) = check_calls(&k, &callers);
    assert!(!values.is_empty());
    let max = *values.last().unwrap();
    // Steps of 7 from 7, every reserved value handed out exactly once.
    assert_eq!(values, (1..=max / 7).map(|i| i * 7).collect::<Vec<_>>());
    assert_eq!(nodes[3].current(&k).await.unwrap(), max);
    println!(
        "storm: {} values, {contended} of {} calls contended (after {MAX_STRICT_ATTEMPTS} attempts each)",
        values.len(),
        8 * 6 * 6
    );
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_consul_fails_calls_at_once_and_values_continue_above() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    // The client's own retries of reads are on: still no hanging.
    let store = ConsulStrictStore::new(consul::client(&consul, Duration::from_secs(1), 3), keys());
    let k = key("books/b1");
    let mut last = store.advance(&k, 1, 3).await.unwrap().last;
    assert_eq!(last, 3);

    for fault in ["refuse", "drop", "no_leader"] {
        match fault {
            "refuse" => consul.faults().refuse("agent-0", true),
            "drop" => consul.faults().drop_requests("agent-0", true),
            _ => consul.faults().no_leader("agent-0", true),
        }
        let started = Instant::now();
        let err = store.advance(&k, 1, 1).await.unwrap_err();
        let elapsed = started.elapsed();
        assert!(matches!(err, StoreError::Backend(_)), "{fault}: {err:?}");
        assert!(err.to_string().contains("books/b1"), "{fault}: {err}");
        // A bound against hanging, not a performance figure.
        assert!(elapsed < Duration::from_secs(10), "{fault}: {elapsed:?}");
        assert!(matches!(
            store.current(&k).await,
            Err(StoreError::Backend(_))
        ));
        match fault {
            "refuse" => consul.faults().refuse("agent-0", false),
            "drop" => consul.faults().drop_requests("agent-0", false),
            _ => consul.faults().no_leader("agent-0", false),
        }
        println!("{fault}: failed in {elapsed:?}");
        let v = store.advance(&k, 1, 2).await.unwrap();
        assert!(v.first > last, "{fault}: {v:?} after {last}");
        last = v.last;
    }

    // A write whose answer was lost but which landed late looks like this:
    // the counter is above anything handed out. The next call re-reads it.
    let other = consul::client(&consul, Duration::from_secs(2), 0);
    let landed = last + 10;
    assert!(other
        .kv_put(
            "idgen/test/strict/books/b1",
            landed.to_string().as_bytes(),
            KvWrite::Set
        )
        .await
        .unwrap());
    let v = store.advance(&k, 1, 1).await.unwrap();
    assert_eq!(v.first, landed + 1);
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_cannot_write_fails_at_once_not_after_retries() {
    let consul = TestConsul::start(Config {
        acl_master_token: Some("master".into()),
        ..Config::default()
    })
    .await
    .unwrap();
    consul.add_token(
        "reader",
        Policy {
            key_prefix_read: vec!["idgen/".into()],
            ..Policy::default()
        },
    );
    let reader = ConsulClient::new(ConsulConfig {
        address: format!("http://{}", consul.addr()),
        acl_token: Some("reader".into()),
        retries: 0,
        ..ConsulConfig::default()
    })
    .unwrap();
    let store = ConsulStrictStore::new(reader, keys());
    let k = key("books/b1");
    let err = store.advance(&k, 1, 1).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(err.to_string().contains("acl-policy.hcl"), "{err}");
    // One read and one txn: the denial was not retried as a lost race.
    assert_eq!(consul.request_count(None, "txn"), 1);
    assert!(consul.kv_get("idgen/test/strict/books/b1").is_none());
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_stored_value_is_an_error_naming_the_key() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let store = ConsulStrictStore::new(consul::client(&consul, Duration::from_secs(2), 0), keys());
    let raw = consul::client(&consul, Duration::from_secs(2), 0);
    let k = key("books/b1");
    store.advance(&k, 1, 5).await.unwrap();
    raw.kv_put("idgen/test/strict/books/b1", b"garbage", KvWrite::Set)
        .await
        .unwrap();
    for err in [
        store.advance(&k, 1, 1).await.unwrap_err(),
        store.current(&k).await.unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("books/b1") && msg.contains("backup"), "{msg}");
    }
    // Never reset: the garbage is still there, nothing was written over it.
    assert_eq!(
        consul.kv_get("idgen/test/strict/books/b1").unwrap().value,
        b"garbage"
    );

    raw.kv_put("idgen/test/strict-namespaces/books", b"-3", KvWrite::Set)
        .await
        .unwrap();
    let err = store.namespace_step(&ns("books")).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("idgen/test/strict-namespaces/books"),
        "{err}"
    );
    assert!(matches!(
        store.namespaces().await,
        Err(StoreError::Backend(_))
    ));
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_steps_round_trip_and_list_sorted() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let nodes = nodes(&consul, 2);
    assert!(nodes[0].namespaces().await.unwrap().is_empty());
    assert_eq!(nodes[0].namespace_step(&ns("orders")).await.unwrap(), None);
    nodes[0]
        .set_namespace_step(&ns("orders"), 10)
        .await
        .unwrap();
    nodes[0].set_namespace_step(&ns("books"), 3).await.unwrap();
    nodes[1].set_namespace_step(&ns("chats"), 7).await.unwrap();
    nodes[1]
        .set_namespace_step(&ns("orders"), 20)
        .await
        .unwrap();
    assert!(matches!(
        nodes[0].set_namespace_step(&ns("books"), 0).await,
        Err(StoreError::Strict(_))
    ));
    assert!(matches!(
        nodes[0].set_namespace_step(&ns("books"), 1_000_001).await,
        Err(StoreError::Strict(_))
    ));
    assert_eq!(
        nodes[0].namespace_step(&ns("orders")).await.unwrap(),
        Some(20)
    );
    assert_eq!(
        nodes[1].namespace_step(&ns("books")).await.unwrap(),
        Some(3)
    );
    let expected = vec![(ns("books"), 3), (ns("chats"), 7), (ns("orders"), 20)];
    assert_eq!(nodes[0].namespaces().await.unwrap(), expected);
    assert_eq!(nodes[1].namespaces().await.unwrap(), expected);
    assert_eq!(
        consul
            .kv_get("idgen/test/strict-namespaces/orders")
            .unwrap()
            .value,
        b"20"
    );
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_always_loses_ends_contended_after_bounded_attempts() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    // This node's agent answers late, so between its read and its write
    // another writer (through the fast agent) always moves the counter.
    let slow = consul.add_agent("agent-1").await.unwrap();
    consul
        .faults()
        .delay("agent-1", Some(Duration::from_millis(40)));
    let store = ConsulStrictStore::new(
        ConsulClient::new(ConsulConfig {
            address: format!("http://{slow}"),
            retries: 0,
            ..ConsulConfig::default()
        })
        .unwrap(),
        keys(),
    );
    let k = key("orders/hot");
    let writer = consul::client(&consul, Duration::from_secs(2), 0);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let interferer = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut value = 1_000_000u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                value += 1;
                writer
                    .kv_put(
                        "idgen/test/strict/orders/hot",
                        value.to_string().as_bytes(),
                        KvWrite::Set,
                    )
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            value
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    let err = store.advance(&k, 1, 1).await.unwrap_err();
    let elapsed = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = interferer.await.unwrap();
    match &err {
        StoreError::Contended(msg) => {
            assert!(msg.contains("orders/hot"), "{msg}");
            assert!(msg.contains(&MAX_STRICT_ATTEMPTS.to_string()), "{msg}");
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    // Exactly the bounded number of writes was tried, and nothing more.
    assert_eq!(
        consul.request_count(Some("agent-1"), "txn"),
        u64::from(MAX_STRICT_ATTEMPTS)
    );
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    println!("contended after {elapsed:?}");
    // Once the storm is over, the next call starts above the other writer.
    consul.faults().delay("agent-1", None);
    let v = store.advance(&k, 1, 1).await.unwrap();
    assert_eq!(v.first, written + 1);
    consul.shutdown().await;
}

/// The latency model of a Consul on good disks, as docs/PERFORMANCE.md's strict
/// figures use it: a Raft write commits after 2 ms (concurrent writes
/// share a round), a consistent read waits 0.5 ms.
fn raft_latency() -> Config {
    Config {
        raft_write_delay: Duration::from_millis(2),
        consistent_read_delay: Duration::from_micros(500),
        ..Config::default()
    }
}

/// `tasks` callers per node, `calls` calls each, the call `c` of task `t`
/// on `keys[(t * 7 + c) % keys.len()]`, recorded with their times; errors
/// fail the test.
async fn timed_calls(
    nodes: &[Arc<ConsulStrictStore>],
    keys: &[StrictKey],
    tasks: usize,
    calls: usize,
) -> HashMap<StrictKey, Vec<Call>> {
    let keys = Arc::new(keys.to_vec());
    let mut handles = Vec::new();
    for node in nodes {
        for t in 0..tasks {
            let (node, keys) = (Arc::clone(node), Arc::clone(&keys));
            handles.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for c in 0..calls {
                    let k = &keys[(t * 7 + c) % keys.len()];
                    let count = 1 + ((t + c) % 3) as u64;
                    let start = Instant::now();
                    let v = node.advance(k, 1, count).await.expect("strict call");
                    let end = Instant::now();
                    assert_eq!(v.count(), count);
                    got.push((
                        k.clone(),
                        Call {
                            start,
                            end,
                            first: v.first,
                            last: v.last,
                        },
                    ));
                }
                got
            }));
        }
    }
    let mut by_key: HashMap<StrictKey, Vec<Call>> = HashMap::new();
    for h in handles {
        for (k, call) in h.await.unwrap() {
            by_key.entry(k).or_default().push(call);
        }
    }
    by_key
}

/// Every key's calls are linearizable and, no write having failed, its
/// values are exactly 1..=max, which the store holds.
async fn check_keys(node: &ConsulStrictStore, by_key: &HashMap<StrictKey, Vec<Call>>) {
    for (k, calls) in by_key {
        assert_linearizable(calls);
        let total: u64 = calls.iter().map(|c| c.last - c.first + 1).sum();
        let max = calls.iter().map(|c| c.last).max().unwrap();
        assert_eq!(max, total, "{k}: values 1..={total} with no gaps");
        assert_eq!(node.current(k).await.unwrap(), max, "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_calls_on_one_node_share_a_write_and_stay_linearizable() {
    let consul = TestConsul::start(raft_latency()).await.unwrap();
    let nodes = nodes(&consul, 1);
    let k = key("orders/combined");
    let by_key = timed_calls(&nodes, std::slice::from_ref(&k), 64, 10).await;
    check_keys(&nodes[0], &by_key).await;
    let txns = consul.request_count(None, "txn");
    // 640 calls; one write per txn would be 640 txns. With 64 callers
    // waiting while a write commits, most txns answer many calls.
    assert!(txns * 4 <= 640, "{txns} txns for 640 calls");
    println!("one node, c64, one key: 640 calls in {txns} txns");
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_on_one_and_many_keys_with_raft_latency_stay_linearizable() {
    let consul = TestConsul::start(raft_latency()).await.unwrap();
    let nodes = nodes(&consul, 3);
    let one = timed_calls(&nodes, &[key("orders/hot")], 16, 10).await;
    check_keys(&nodes[1], &one).await;

    let many: Vec<StrictKey> = (0..100).map(|i| key(&format!("orders/k{i}"))).collect();
    let before = consul.request_count(None, "txn");
    let by_key = timed_calls(&nodes, &many, 16, 10).await;
    assert!(by_key.len() >= 90, "{} keys used", by_key.len());
    check_keys(&nodes[2], &by_key).await;
    let txns = consul.request_count(None, "txn") - before;
    // 480 calls on up to 100 keys from 3 nodes: keys share txns.
    assert!(txns < 480, "{txns} txns for 480 calls");
    println!("three nodes, c16 each: 100 keys, 480 calls in {txns} txns");
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_times_out_mid_batch_hands_out_nothing_and_values_continue_above() {
    let consul = TestConsul::start(raft_latency()).await.unwrap();
    let agent = consul.add_agent("agent-1").await.unwrap();
    let store = Arc::new(ConsulStrictStore::new(
        ConsulClient::new(ConsulConfig {
            address: format!("http://{agent}"),
            timeout: Duration::from_millis(300),
            retries: 0,
            ..ConsulConfig::default()
        })
        .unwrap(),
        keys(),
    ));
    let k = key("orders/faulty");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut callers = Vec::new();
    for t in 0..16u64 {
        let (store, k, stop) = (Arc::clone(&store), k.clone(), Arc::clone(&stop));
        callers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (Vec::new(), 0u32);
            // Bounded by count, whatever the faults do.
            for c in 0..400u64 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let start = Instant::now();
                match store.advance(&k, 1, 1 + (t + c) % 3).await {
                    Ok(v) => ok.push(Call {
                        start,
                        end: Instant::now(),
                        first: v.first,
                        last: v.last,
                    }),
                    Err(StoreError::Backend(msg)) => {
                        assert!(msg.contains("orders/faulty"), "{msg}");
                        failed += 1;
                    }
                    Err(e) => panic!("unexpected error: {e:?}"),
                }
            }
            (ok, failed)
        }));
    }
    let faults = consul.faults();
    // While calls run on the cached index (writes only, no reads):
    tokio::time::sleep(Duration::from_millis(150)).await;
    // never answered and never applied: values handed out here would be
    // handed out again from the next read;
    faults.drop_requests("agent-1", true);
    tokio::time::sleep(Duration::from_millis(700)).await;
    faults.drop_requests("agent-1", false);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // applied, but answered after the client gave up: outcome unknown.
    faults.delay("agent-1", Some(Duration::from_millis(600)));
    tokio::time::sleep(Duration::from_millis(700)).await;
    faults.delay("agent-1", None);
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut calls, mut failed) = (Vec::new(), 0);
    for c in callers {
        let (ok, f) = c.await.unwrap();
        calls.extend(ok);
        failed += f;
    }
    assert!(failed > 0, "the faults failed no call");
    assert_linearizable(&calls);
    let max = calls.iter().map(|c| c.last).max().unwrap();
    // A late write may have landed: a gap above max, never below.
    let v = store.advance(&k, 1, 1).await.unwrap();
    assert!(v.first > max, "{v:?} after {max}");
    println!(
        "{} calls got values, {failed} failed with the write's outcome unknown",
        calls.len()
    );
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_batch_is_one_round_trip_and_a_foreign_write_is_read_again() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let store = &nodes(&consul, 1)[0];
    let k = key("orders/cached");
    assert_eq!(store.advance(&k, 1, 1).await.unwrap().first, 1);
    let (reads, txns) = (
        consul.request_count(None, "kv"),
        consul.request_count(None, "txn"),
    );
    for i in 2..=11 {
        let v = store.advance(&k, 1, 1).await.unwrap();
        assert_eq!(v.first, i);
    }
    // Ten calls, ten txns and not one read: the cached index is used.
    assert_eq!(consul.request_count(None, "kv"), reads);
    assert_eq!(consul.request_count(None, "txn"), txns + 10);
    // Another writer moves the key: the cas on the cached index fails,
    // the key is read again, and values continue above the other write.
    let other = consul::client(&consul, Duration::from_secs(2), 0);
    assert!(other
        .kv_put("idgen/test/strict/orders/cached", b"1000", KvWrite::Set)
        .await
        .unwrap());
    let v = store.advance(&k, 1, 2).await.unwrap();
    assert_eq!((v.first, v.last), (1001, 1002));
    assert_eq!(consul.request_count(None, "txn"), txns + 12);
    consul.shutdown().await;
}
