use std::collections::BTreeMap;
use std::path::Path;

use std::sync::Arc;
use std::time::Duration;

use super::combine::parse_decimal;
use super::consul::{backoff, parse_step};
use super::embedded::{apply_batch, Ask};
use super::*;
use crate::id::strict::{StrictError, MAX_VALUE};
use crate::store::EmbeddedStore;

fn key(s: &str) -> StrictKey {
    StrictKey::parse(s).unwrap()
}

fn ns(s: &str) -> Namespace {
    Namespace::parse(s).unwrap()
}

fn ask(k: &str, step: u64, count: u64) -> Ask {
    Ask {
        key: key(k),
        step,
        count,
    }
}

fn fresh(dir: &Path) -> (std::path::PathBuf, EmbeddedStrictStore) {
    let path = dir.join("state.redb");
    let store = EmbeddedStore::create(&path, "layout").unwrap();
    (path, EmbeddedStrictStore::new(store))
}

/// Writes a counter directly, bypassing the committer.
fn seed(store: &EmbeddedStore, k: &str, value: u64) {
    let txn = store.db().begin_write().unwrap();
    txn.open_table(STRICT).unwrap().insert(k, value).unwrap();
    txn.commit().unwrap();
}

#[tokio::test]
async fn values_follow_each_other_with_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = fresh(dir.path());
    let k = key("books/b1");
    assert_eq!(store.current(&k).await.unwrap(), 0);
    for expected in 1..=3 {
        let v = store.advance(&k, 1, 1).await.unwrap();
        assert_eq!((v.first, v.last, v.step), (expected, expected, 1));
    }
    assert_eq!(store.current(&k).await.unwrap(), 3);

    let k5 = key("books/b5");
    let v = store.advance(&k5, 5, 3).await.unwrap();
    assert_eq!((v.first, v.last, v.step), (5, 15, 5));
    assert_eq!(v.iter().collect::<Vec<_>>(), vec![5, 10, 15]);
    let v = store.advance(&k5, 5, 1).await.unwrap();
    assert_eq!((v.first, v.last), (20, 20));
    assert_eq!(store.current(&k5).await.unwrap(), 20);
    // The other key did not move.
    assert_eq!(store.current(&k).await.unwrap(), 3);
}

#[tokio::test]
async fn bad_requests_are_refused_without_moving_the_counter() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = fresh(dir.path());
    let k = key("books/b1");
    store.advance(&k, 1, 2).await.unwrap();
    for (step, count) in [(0, 1), (crate::id::strict::MAX_STEP + 1, 1), (1, 0)] {
        let err = store.advance(&k, step, count).await.unwrap_err();
        assert!(matches!(err, StoreError::Strict(_)), "{err:?}");
    }
    assert_eq!(store.current(&k).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_get_distinct_contiguous_increasing_values() {
    const TASKS: usize = 64;
    const CALLS: usize = 50;
    const KEYS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = fresh(dir.path());
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let k = key(&format!("chats/c{}", t % KEYS));
            let count = 1 + (t % 3) as u64;
            let mut got = Vec::new();
            for _ in 0..CALLS {
                got.push(store.advance(&k, 1, count).await.unwrap());
            }
            (k, got)
        }));
    }
    let mut per_key: BTreeMap<StrictKey, Vec<u64>> = BTreeMap::new();
    for task in tasks {
        let (k, got) = task.await.unwrap();
        // Each caller's values strictly increase, call after call.
        for pair in got.windows(2) {
            assert!(pair[1].first > pair[0].last, "{k}: {pair:?}");
        }
        per_key
            .entry(k)
            .or_default()
            .extend(got.iter().flat_map(Values::iter));
    }
    assert_eq!(per_key.len(), KEYS);
    let mut requests = 0;
    for (k, mut values) in per_key {
        let n = values.len() as u64;
        values.sort_unstable();
        // Every commit succeeded, so no gaps: exactly 1..=n, each once.
        assert_eq!(values, (1..=n).collect::<Vec<_>>(), "{k}");
        assert_eq!(store.current(&k).await.unwrap(), n, "{k}");
        requests += 1;
    }
    assert_eq!(requests, KEYS);
    let commits = store.commits();
    let calls = (TASKS * CALLS) as u64;
    assert!(
        commits >= 1 && commits < calls,
        "{commits} commits for {calls} calls"
    );

    // A restart: the next value is above every value handed out.
    let before = store.current(&key("chats/c0")).await.unwrap();
    drop(store);
    let reopened = EmbeddedStrictStore::new(EmbeddedStore::open(&path, "layout", false).unwrap());
    let v = reopened.advance(&key("chats/c0"), 1, 1).await.unwrap();
    assert_eq!(v.first, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = fresh(dir.path());
    let store = Arc::new(store);
    let db = store.store.clone();
    // Hold the write lock so every call piles up behind the committer.
    let held = db.db().begin_write().unwrap();
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            store
                .advance(&key(&format!("n/k{}", i % 4)), 1, 1)
                .await
                .unwrap()
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store.commits(),
        0,
        "nothing may commit while the lock is held"
    );
    held.abort().unwrap();
    let mut values = Vec::new();
    for task in tasks {
        values.push(task.await.unwrap().first);
    }
    values.sort_unstable();
    values.dedup();
    assert_eq!(values, (1..=16).collect::<Vec<_>>());
    // The first request alone (already taken when the lock was held),
    // then everything that queued meanwhile.
    let commits = store.commits();
    assert!((1..=3).contains(&commits), "{commits} commits for 64 calls");
}

#[test]
fn one_exhausted_request_does_not_fail_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let store = EmbeddedStore::create(&path, "layout").unwrap();
    seed(&store, "n/full", MAX_VALUE - 1);
    let batch = [
        ask("n/a", 1, 1),
        ask("n/full", 1, 2),
        ask("n/a", 1, 1),
        ask("n/full", 1, 1),
        ask("n/b", 3, 2),
        ask("n/full", 1, 1),
    ];
    let out = apply_batch(&store, &batch, StrictLimits::NONE).unwrap();
    assert_eq!(out.len(), batch.len());
    // Same key, one batch: each request sees the one before it.
    assert_eq!(out[0].as_ref().unwrap().first, 1);
    assert_eq!(out[2].as_ref().unwrap().first, 2);
    assert!(
        matches!(
            out[1],
            Err(StoreError::Strict(StrictError::Exhausted { .. }))
        ),
        "{:?}",
        out[1]
    );
    assert_eq!(out[3].as_ref().unwrap().first, MAX_VALUE);
    let b = out[4].as_ref().unwrap();
    assert_eq!((b.first, b.last), (3, 6));
    assert!(matches!(
        out[5],
        Err(StoreError::Strict(StrictError::Exhausted { .. }))
    ));
    // Committed: the good requests are durable.
    assert_eq!(store.read_u64(STRICT, "n/a").unwrap(), Some(2));
    assert_eq!(store.read_u64(STRICT, "n/b").unwrap(), Some(6));
    assert_eq!(store.read_u64(STRICT, "n/full").unwrap(), Some(MAX_VALUE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_key_fails_alone_through_the_committer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let inner = EmbeddedStore::create(&path, "layout").unwrap();
    seed(&inner, "n/full", MAX_VALUE);
    let store = Arc::new(EmbeddedStrictStore::new(inner.clone()));
    let held = inner.db().begin_write().unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = Arc::clone(&store);
        let k = if i % 2 == 0 { "n/full" } else { "n/ok" };
        tasks.push(tokio::spawn(
            async move { store.advance(&key(k), 1, 1).await },
        ));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.abort().unwrap();
    let mut ok = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.unwrap() {
            Ok(v) if i % 2 == 1 => ok.push(v.first),
            Err(StoreError::Strict(StrictError::Exhausted { .. })) if i % 2 == 0 => {}
            other => panic!("call {i}: {other:?}"),
        }
    }
    ok.sort_unstable();
    assert_eq!(ok, (1..=10).collect::<Vec<_>>());
    assert!(store.commits() < 20, "{} commits", store.commits());
}

#[tokio::test]
async fn files_without_strict_tables_read_as_empty() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = fresh(dir.path());
    assert_eq!(store.current(&key("a/b")).await.unwrap(), 0);
    assert_eq!(store.namespace_step(&ns("a")).await.unwrap(), None);
    assert!(store.namespaces().await.unwrap().is_empty());
}

#[tokio::test]
async fn namespace_steps_round_trip_and_list_sorted() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = fresh(dir.path());
    store.set_namespace_step(&ns("orders"), 10).await.unwrap();
    store.set_namespace_step(&ns("books"), 3).await.unwrap();
    store.set_namespace_step(&ns("chats"), 7).await.unwrap();
    store.set_namespace_step(&ns("orders"), 20).await.unwrap();
    assert!(matches!(
        store.set_namespace_step(&ns("books"), 0).await,
        Err(StoreError::Strict(StrictError::BadStep(0)))
    ));
    assert_eq!(store.namespace_step(&ns("orders")).await.unwrap(), Some(20));
    assert_eq!(store.namespace_step(&ns("books")).await.unwrap(), Some(3));
    assert_eq!(store.namespace_step(&ns("none")).await.unwrap(), None);
    let expected = vec![(ns("books"), 3), (ns("chats"), 7), (ns("orders"), 20)];
    assert_eq!(store.namespaces().await.unwrap(), expected);
    drop(store);
    let store = EmbeddedStrictStore::new(EmbeddedStore::open(&path, "layout", false).unwrap());
    assert_eq!(store.namespaces().await.unwrap(), expected);
}

/// Namespaces in use without a stored step are listed too (the console
/// left them out): every namespace with a live key, once, sorted by name,
/// and a namespace whose last key was deleted no more.
async fn key_namespaces_are_listed(store: &dyn StrictStore) {
    assert!(store.key_namespaces().await.unwrap().is_empty());
    for k in ["a/x", "a/y", "a-b/z", "chats/1", "zeta/q"] {
        store.advance(&key(k), 1, 1).await.unwrap();
    }
    store.set_namespace_step(&ns("books"), 3).await.unwrap();
    let names = vec![ns("a"), ns("a-b"), ns("chats"), ns("zeta")];
    assert_eq!(store.key_namespaces().await.unwrap(), names);
    store.delete_key(&key("zeta/q")).await.unwrap();
    assert_eq!(store.key_namespaces().await.unwrap(), names[..3].to_vec());
}

#[tokio::test]
async fn namespaces_with_live_keys_are_listed_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = fresh(dir.path());
    key_namespaces_are_listed(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_with_live_keys_are_listed_on_consul() {
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
        .await
        .unwrap();
    let keys = crate::store::kv_paths::ClusterPaths::new("idgen", "test");
    let store = ConsulStrictStore::new(crate::store::test_consul_client(consul.addr()), keys);
    key_namespaces_are_listed(&store).await;
}

#[test]
fn dropping_the_store_stops_its_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = fresh(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(store.advance(&key("n/k"), 1, 1)).unwrap();
    drop(store);
    // The committer held the file; it is free again at once.
    let reopened = EmbeddedStore::open(&path, "layout", false).unwrap();
    assert_eq!(reopened.read_u64(STRICT, "n/k").unwrap(), Some(1));
}

#[test]
fn stored_numbers_must_be_plain_digits() {
    assert_eq!(parse_decimal(b"42"), Some(42));
    assert_eq!(parse_decimal(b"0"), Some(0));
    for bad in [
        &b""[..],
        b"+1",
        b"-1",
        b" 1",
        b"1.0",
        b"garbage",
        b"99999999999999999999",
    ] {
        assert_eq!(
            parse_decimal(bad),
            None,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    assert!(parse_step("k", b"0").is_err());
    assert!(parse_step("k", b"1000001").is_err());
    assert_eq!(parse_step("k", b"5").unwrap(), 5);
}

#[test]
fn backoff_stays_under_its_cap() {
    for attempt in 0..40 {
        let d = backoff(attempt);
        assert!(d <= MAX_STRICT_BACKOFF, "attempt {attempt}: {d:?}");
        assert!(d <= Duration::from_millis(5 << attempt.min(5)));
    }
}

/// A read task that panics while planning a combined txn fails its own
/// calls and frees its key: the next call on the key is served (it used to
/// wait forever, the key marked busy), and its values follow the ones
/// committed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_read_frees_its_key() {
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
        .await
        .unwrap();
    let keys = crate::store::kv_paths::ClusterPaths::new("idgen", "test");
    let store = ConsulStrictStore::new(crate::store::test_consul_client(consul.addr()), keys);
    let k = key(combine::PANICS_ON_FIRST_READ);
    let first = store.advance(&k, 1, 1).await;
    assert!(
        matches!(&first, Err(StoreError::Backend(m)) if m.contains("no values were handed out")),
        "{first:?}"
    );
    let bound = Duration::from_secs(30);
    for expected in 1..=3 {
        let v = tokio::time::timeout(bound, store.advance(&k, 1, 1))
            .await
            .expect("the key was freed after the panicking read")
            .unwrap();
        assert_eq!(v.first, expected, "{v:?}");
    }
    consul.shutdown().await;
}

/// A strict call whose txns keep failing only on this node's mark check
/// (the mark rewritten between every re-read and write, which its keeper's
/// one write a second never does for long) is answered with an error
/// after [`combine::MAX_MARK_MOVES`] txns instead of retrying for ever;
/// nothing was handed out, so once the mark holds still the key's next
/// value is its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_that_keeps_moving_fails_the_call_after_a_bound() {
    use crate::consul::{Consistency, KvWrite};
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
        .await
        .unwrap();
    let keys = crate::store::kv_paths::ClusterPaths::new("idgen", "test");
    let client = crate::store::test_consul_client(consul.addr());
    let mark = keys.hwm(crate::store::WorkerKey {
        datacenter: 0,
        worker: 0,
    });
    let mark = mark.as_str();
    client.kv_put(mark, b"1000", KvWrite::Set).await.unwrap();
    let (entry, _) = client.kv_get(mark, Consistency::Consistent).await.unwrap();
    keys.mark_at(mark, entry.unwrap().modify_index);
    let store = ConsulStrictStore::new(client, keys);
    consul.faults().write_before_each_txn(Some(mark));
    let k = key("books/b1");
    let bound = Duration::from_secs(30);
    let failed = tokio::time::timeout(bound, store.advance(&k, 1, 1))
        .await
        .expect("the call ends while the mark keeps moving");
    assert!(
        matches!(&failed, Err(StoreError::Contended(m)) if m.contains("high-water mark moved")),
        "{failed:?}"
    );
    let txns = consul.request_count(None, "txn");
    assert!(
        txns >= u64::from(combine::MAX_MARK_MOVES),
        "only {txns} txns"
    );
    consul.faults().write_before_each_txn(None);
    let v = store.advance(&k, 1, 1).await.unwrap();
    assert_eq!(v.first, 1, "a value was handed out by the failed call");
    consul.shutdown().await;
}
