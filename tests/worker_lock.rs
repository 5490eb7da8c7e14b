//! Worker locks (worker ids claimed in Consul) and Consul-held high-water marks against the in-repo
//! Consul-compatible test server (short TTLs so the tests stay quick).

use std::time::{Duration, Instant};

use consul_testserver::{Config, TestConsul};
use idgen::cluster::worker_lock::{WorkerLock, WorkerLockError, WorkerLockSettings};
use idgen::consul::{ConsulClient, ConsulConfig};
use idgen::store::{
    hwm::ConsulHwmStore,
    kv_paths::{ClusterPaths, OwnerInfo},
};
use idgen::store::{HwmStore, WorkerKey};

async fn server() -> TestConsul {
    TestConsul::start(Config {
        min_ttl: Duration::from_secs(1),
        ..Config::default()
    })
    .await
    .expect("test consul")
}

fn client(consul: &TestConsul) -> ConsulClient {
    ConsulClient::new(ConsulConfig {
        address: format!("http://{}", consul.addr()),
        timeout: Duration::from_millis(500),
        retries: 1,
        backoff: Duration::from_millis(10),
        ..ConsulConfig::default()
    })
    .unwrap()
}

fn owner(instance: &str) -> OwnerInfo {
    OwnerInfo {
        instance: instance.into(),
        address: "127.0.0.1:50051".into(),
        since_ms: 1,
    }
}

/// TTL 1 s (expiry between 1 and 2 s), lock-delay 1 s, margin 200 ms.
fn fast() -> WorkerLockSettings {
    WorkerLockSettings {
        ttl: Duration::from_secs(1),
        lock_delay: Duration::from_secs(1),
        margin: Duration::from_millis(200),
    }
}

fn keys() -> ClusterPaths {
    ClusterPaths::new("idgen", "test")
}

async fn claim(
    consul: &TestConsul,
    instance: &str,
    max: u64,
) -> Result<WorkerLock, WorkerLockError> {
    WorkerLock::claim(client(consul), keys(), 0, max, &owner(instance), fast()).await
}

#[tokio::test]
async fn nodes_get_distinct_ids_and_a_clean_restart_gets_its_id_back() {
    let consul = server().await;
    let a = claim(&consul, "a", 31).await.unwrap();
    let b = claim(&consul, "b", 31).await.unwrap();
    let c = claim(&consul, "c", 31).await.unwrap();
    let ids: Vec<u64> = [&a, &b, &c].iter().map(|l| l.key().worker).collect();
    assert_eq!(ids, [0, 1, 2], "lowest free ids, all distinct");
    b.release().await.unwrap();
    // Released cleanly: no lock-delay, and b prefers the id it held.
    let b2 = claim(&consul, "b", 31).await.unwrap();
    assert_eq!(b2.key().worker, 1);
    let d = claim(&consul, "d", 31).await.unwrap();
    assert_eq!(d.key().worker, 3);
    let entry = consul.kv_get("idgen/test/workers/0/1").expect("lock key");
    assert!(String::from_utf8_lossy(&entry.value).contains("\"instance\":\"b\""));
    for l in [a, b2, c, d] {
        l.release().await.unwrap();
    }
    consul.shutdown().await;
}

#[tokio::test]
async fn an_exhausted_id_space_is_a_clear_error() {
    let consul = server().await;
    let _a = claim(&consul, "a", 1).await.unwrap();
    let _b = claim(&consul, "b", 1).await.unwrap();
    let err = claim(&consul, "c", 1).await.unwrap_err();
    assert!(
        matches!(err, WorkerLockError::NoFreeWorker { max: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("no free worker id"));
    // The failed claimant left no session behind.
    assert_eq!(consul.sessions().len(), 2);
    consul.shutdown().await;
}

#[tokio::test]
async fn a_dead_nodes_id_waits_for_expiry_and_lock_delay() {
    let consul = server().await;
    let dead = claim(&consul, "dead", 0).await.unwrap();
    let died_at = Instant::now();
    // kill -9: no release, no destroy, no more renewals.
    drop(dead);
    let err = claim(&consul, "new", 0).await.unwrap_err();
    assert!(matches!(err, WorkerLockError::NoFreeWorker { .. }));
    let mut taken = None;
    for _ in 0..100 {
        match claim(&consul, "new", 0).await {
            Ok(lease) => {
                taken = Some(lease);
                break;
            }
            Err(WorkerLockError::NoFreeWorker { .. }) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    let lease = taken.expect("claimable once the session expired and lock-delay passed");
    let waited = died_at.elapsed();
    // Expiry lands at TTL..2xTTL after the last renew, then 1 s lock-delay.
    assert!(
        waited >= Duration::from_secs(2),
        "claimed after only {waited:?}"
    );
    assert_eq!(lease.key().worker, 0);
    lease.release().await.unwrap();
    consul.shutdown().await;
}

#[tokio::test]
async fn hwm_writes_need_the_lock_and_reads_are_consistent() {
    let consul = server().await;
    let lease = claim(&consul, "a", 31).await.unwrap();
    let key = lease.key();
    let store = ConsulHwmStore::new(client(&consul), keys(), lease.session());
    assert_eq!(store.load_hwm(key).await.unwrap(), None);
    store.store_hwm(key, 1_234).await.unwrap();
    assert_eq!(store.load_hwm(key).await.unwrap(), Some(1_234));
    // A worker id this session does not hold: refused.
    let other = WorkerKey {
        datacenter: 0,
        worker: key.worker + 1,
    };
    let err = store.store_hwm(other, 9_999).await.unwrap_err();
    assert!(err.to_string().contains("no longer holds"), "{err}");
    assert_eq!(
        store.load_hwm(other).await.unwrap(),
        None,
        "nothing written"
    );
    // After the lease is given up, the old session cannot write any more.
    lease.release().await.unwrap();
    assert!(store.store_hwm(key, 5_000).await.is_err());
    assert_eq!(store.load_hwm(key).await.unwrap(), Some(1_234));
    consul.shutdown().await;
}

#[tokio::test]
async fn a_partitioned_node_fences_before_its_session_can_expire() {
    let consul = server().await;
    let lease = claim(&consul, "a", 31).await.unwrap();
    // Renewals keep it alive well past the TTL.
    let kept = tokio::time::timeout(
        Duration::from_millis(2500),
        lease.keep_alive(std::future::pending()),
    )
    .await;
    assert!(kept.is_err(), "still held after 2.5 s of renewing");
    let session = lease.session().to_owned();
    consul.faults().refuse("agent-0", true);
    let cut_at = Instant::now();
    let held = lease.keep_alive(std::future::pending()).await;
    assert!(!held, "the lease is given up");
    let fenced_after = cut_at.elapsed();
    // The deadline is at most TTL - margin after the last renew.
    assert!(
        fenced_after <= Duration::from_millis(900),
        "fenced after {fenced_after:?}"
    );
    assert!(
        consul.sessions().iter().any(|s| s.id == session),
        "the server still holds the session when the node stops issuing"
    );
    consul.faults().refuse("agent-0", false);
    consul.shutdown().await;
}

/// A partition where requests hang instead of failing: the renew in flight
/// must not carry the node past its deadline.
#[tokio::test]
async fn a_hanging_renew_does_not_delay_fencing() {
    let consul = server().await;
    // Client timeout (500 ms) x 2 attempts is longer than the 800 ms lease.
    let lease = claim(&consul, "a", 31).await.unwrap();
    let session = lease.session().to_owned();
    consul.faults().drop_requests("agent-0", true);
    let cut_at = Instant::now();
    assert!(!lease.keep_alive(std::future::pending()).await);
    let fenced_after = cut_at.elapsed();
    assert!(
        fenced_after <= Duration::from_secs(1),
        "fenced after {fenced_after:?}"
    );
    assert!(consul.sessions().iter().any(|s| s.id == session));
    consul.faults().drop_requests("agent-0", false);
    consul.shutdown().await;
}

#[tokio::test]
async fn a_destroyed_session_is_noticed_at_the_next_renew() {
    let consul = server().await;
    let lease = claim(&consul, "a", 31).await.unwrap();
    client(&consul)
        .session_destroy(lease.session())
        .await
        .unwrap();
    let started = Instant::now();
    assert!(!lease.keep_alive(std::future::pending()).await);
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "well before the deadline"
    );
    consul.shutdown().await;
}

/// A mark write whose answer is lost may still be applied; the next write
/// re-reads and compare-and-sets, so it lands, and an earlier value can
/// never overwrite a later one.
#[tokio::test]
async fn hwm_writes_with_unknown_outcome_are_reread_before_the_next() {
    let consul = server().await;
    let lease = claim(&consul, "a", 31).await.unwrap();
    let key = lease.key();
    let store = ConsulHwmStore::new(client(&consul), keys(), lease.session());
    store.store_hwm(key, 1_000).await.unwrap();
    // The server applies the write but answers too late for the client.
    consul
        .faults()
        .delay("agent-0", Some(Duration::from_millis(800)));
    assert!(store.store_hwm(key, 2_000).await.is_err());
    consul.faults().delay("agent-0", None);
    assert_eq!(
        store.load_hwm(key).await.unwrap(),
        Some(2_000),
        "it was applied"
    );
    store.store_hwm(key, 3_000).await.unwrap();
    // Someone else changes the mark between our writes: refused, not
    // overwritten blindly; the following write re-reads and lands.
    let hwm_key = format!("idgen/test/hwm/0/{}", key.worker);
    client(&consul)
        .kv_put(&hwm_key, b"9000", idgen::consul::KvWrite::Set)
        .await
        .unwrap();
    let err = store.store_hwm(key, 4_000).await.unwrap_err();
    assert!(err.to_string().contains("changed under it"), "{err}");
    assert_eq!(store.load_hwm(key).await.unwrap(), Some(9_000));
    store.store_hwm(key, 9_500).await.unwrap();
    assert_eq!(store.load_hwm(key).await.unwrap(), Some(9_500));
    lease.release().await.unwrap();
    consul.shutdown().await;
}

/// A restore that takes a node's own mark back below what it wrote (the
/// value written by hand here, as a snapshot restore would put it back) is
/// reported once, as the cluster regression record, and the node goes on
/// from its own write rather than refusing: its next write puts the mark
/// back above it. Before, every later read refused and reported again, so
/// the record came back after a skip-ahead deleted it (a skip-ahead run
/// moving the marks after that node's retry), stopping the cluster until
/// another run.
#[tokio::test]
async fn a_mark_rolled_back_under_its_node_is_reported_once_and_rewritten_above_its_write() {
    let consul = server().await;
    let lease = claim(&consul, "a", 31).await.unwrap();
    let key = lease.key();
    let store = ConsulHwmStore::new(client(&consul), keys(), lease.session());
    store.store_hwm(key, 10_000).await.unwrap();
    let raw = client(&consul);
    let hwm_key = format!("idgen/test/hwm/0/{}", key.worker);
    raw.kv_put(&hwm_key, b"5000", idgen::consul::KvWrite::Set)
        .await
        .unwrap();

    // Read at a restart of the keeper (the supervisor's path after the
    // fenced write): the node's own write, never the rolled-back value.
    assert_eq!(store.load_hwm(key).await.unwrap(), Some(10_000));
    store.store_hwm(key, 12_000).await.unwrap();
    // The detection was written as the cluster record (by the next
    // refresh, which every mark read and write does).
    store.load_hwm(key).await.unwrap();
    let record = "idgen/test/regression";
    let (found, _) = raw
        .kv_get(record, idgen::consul::Consistency::Consistent)
        .await
        .unwrap();
    let found = found.expect("the rollback was recorded");
    let text = String::from_utf8_lossy(&found.value).to_string();
    assert!(text.contains(&hwm_key) && text.contains("5000"), "{text}");

    // A skip-ahead deletes the record; the node goes on and never writes
    // it again, its mark being above its write since.
    raw.kv_delete(record, None).await.unwrap();
    for mark in [13_000, 14_000, 15_000] {
        assert_eq!(store.load_hwm(key).await.unwrap(), Some(mark - 1_000));
        store.store_hwm(key, mark).await.unwrap();
    }
    let (again, _) = raw
        .kv_get(record, idgen::consul::Consistency::Consistent)
        .await
        .unwrap();
    assert!(again.is_none(), "the record came back: {again:?}");
    let stored = raw
        .kv_get(&hwm_key, idgen::consul::Consistency::Consistent)
        .await
        .unwrap()
        .0
        .map(|e| String::from_utf8_lossy(&e.value).to_string());
    assert_eq!(stored.as_deref(), Some("15000"));
    lease.release().await.unwrap();
    consul.shutdown().await;
}
