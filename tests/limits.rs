//! Bounded growth on both backends: the live segment tags, strict keys
//! per namespace and strict namespaces are capped (the one past the limit
//! is refused with `LimitReached`, nothing is created, existing ones keep
//! working, deleting one frees a slot), and a deleted strict key used
//! again continues above its tombstone: its values never repeat.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::consul;
use consul_testserver::{Config, TestConsul};
use idgen::consul::{ConsulClient, ConsulConfig};
use idgen::id::segment::{SegmentError, Tag, TagRecord};
use idgen::id::strict::{Namespace, StrictError, StrictKey};
use idgen::id::LimitReached;
use idgen::store::kv_paths::ClusterPaths;
use idgen::store::strict::{ConsulStrictStore, EmbeddedStrictStore, StrictLimits, StrictStore};
use idgen::store::{ConsulSegmentStore, CreateTag, EmbeddedStore, SegmentStore, StoreError};

fn tag(name: &str) -> Tag {
    Tag::parse(name).unwrap()
}

fn key(s: &str) -> StrictKey {
    StrictKey::parse(s).unwrap()
}

fn ns(s: &str) -> Namespace {
    Namespace::parse(s).unwrap()
}

fn record() -> TagRecord {
    TagRecord::new(0, 10, "", 1).unwrap()
}

fn assert_limit(err: &StoreError, setting: &str) {
    match err {
        StoreError::Segment(SegmentError::LimitReached(LimitReached { setting: s, .. }))
        | StoreError::Strict(StrictError::LimitReached(LimitReached { setting: s, .. })) => {
            assert_eq!(*s, setting, "{err}")
        }
        other => panic!("expected the {setting} limit, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(setting) && text.contains("delete unused"),
        "the message names the setting and what to do: {text}"
    );
}

async fn consul() -> TestConsul {
    TestConsul::start(Config::default()).await.unwrap()
}

fn keys() -> ClusterPaths {
    ClusterPaths::new("idgen", "limits")
}

/// The tag limit's contract, the same on every backend (limit 3).
async fn tag_limit_contract(store: &dyn SegmentStore) {
    const MAX: u64 = 3;
    for name in ["a", "b", "c"] {
        store
            .create_tag(&tag(name), &record(), CreateTag::limited(MAX))
            .await
            .unwrap();
    }
    let err = store
        .create_tag(&tag("d"), &record(), CreateTag::limited(MAX))
        .await
        .unwrap_err();
    assert_limit(&err, "segment.max_tags");
    // Nothing was created, and the existing tags keep working.
    assert_eq!(store.get_tag(&tag("d")).await.unwrap(), None);
    assert!(matches!(
        store.take_range(&tag("d"), 10, 2).await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));
    let a1 = store.take_range(&tag("a"), 10, 2).await.unwrap();
    assert_eq!((a1.first, a1.last), (1, 10));
    assert_eq!(store.list_tags().await.unwrap().tags.len(), 3);

    // Deleting one frees a slot (its tombstone does not count)...
    store.delete_tag(&tag("a"), 3).await.unwrap();
    store
        .create_tag(&tag("d"), &record(), CreateTag::limited(MAX))
        .await
        .unwrap();
    let err = store
        .create_tag(&tag("e"), &record(), CreateTag::limited(MAX))
        .await
        .unwrap_err();
    assert_limit(&err, "segment.max_tags");
    // ...and reviving a deleted tag takes one: refused while full.
    let err = store
        .create_tag(&tag("a"), &record(), CreateTag::limited(MAX))
        .await
        .unwrap_err();
    assert_limit(&err, "segment.max_tags");
    store.delete_tag(&tag("b"), 4).await.unwrap();
    let again = store
        .create_tag(&tag("a"), &record(), CreateTag::limited(MAX))
        .await
        .unwrap();
    // Created again: above everything the old tag handed out.
    assert_eq!(again.max_id, 10);
    assert_eq!(store.take_range(&tag("a"), 10, 5).await.unwrap().first, 11);
}

/// The strict limits' and delete's contract, the same on every backend:
/// 2 live keys per namespace, 2 namespaces with live keys.
async fn strict_contract(store: &dyn StrictStore) {
    let mut handed: BTreeSet<u64> = BTreeSet::new();
    let mut take = |v: idgen::id::strict::Values| {
        for x in v.iter() {
            assert!(handed.insert(x), "value {x} of books/a handed out twice");
        }
        v
    };
    take(store.advance(&key("books/a"), 1, 3).await.unwrap());
    store.advance(&key("books/b"), 1, 1).await.unwrap();
    let err = store.advance(&key("books/c"), 1, 1).await.unwrap_err();
    assert_limit(&err, "strict.max_keys_per_namespace");
    // Nothing was created, and the existing keys keep working.
    assert_eq!(store.current(&key("books/c")).await.unwrap(), 0);
    let v = take(store.advance(&key("books/a"), 1, 1).await.unwrap());
    assert_eq!(v.first, 4);
    // Namespaces: a second one is fine, a third is refused.
    store.advance(&key("chats/x"), 1, 1).await.unwrap();
    let err = store.advance(&key("users/u"), 1, 1).await.unwrap_err();
    assert_limit(&err, "strict.max_namespaces");

    let listed = store.list_keys(&ns("books")).await.unwrap();
    assert_eq!(listed, vec![(key("books/a"), 4), (key("books/b"), 1)]);
    assert!(store.list_keys(&ns("users")).await.unwrap().is_empty());

    // Delete: the last value comes back, the key is gone from the list,
    // and its slot is free.
    assert_eq!(store.delete_key(&key("books/a")).await.unwrap(), 4);
    assert!(matches!(
        store.delete_key(&key("books/a")).await,
        Err(StoreError::Strict(StrictError::KeyNotFound(_)))
    ));
    assert_eq!(
        store.list_keys(&ns("books")).await.unwrap(),
        vec![(key("books/b"), 1)]
    );
    assert_eq!(store.current(&key("books/a")).await.unwrap(), 4);
    store.advance(&key("books/c"), 1, 1).await.unwrap();
    // Full again: the deleted key cannot come back until a slot frees up.
    let err = store.advance(&key("books/a"), 1, 1).await.unwrap_err();
    assert_limit(&err, "strict.max_keys_per_namespace");
    store.delete_key(&key("books/c")).await.unwrap();

    // Used again: continues above its tombstone, never repeats.
    let v = take(store.advance(&key("books/a"), 1, 2).await.unwrap());
    assert_eq!((v.first, v.last), (5, 6));
    // Deleted and used again twice more: still above everything.
    for _ in 0..2 {
        assert!(store.delete_key(&key("books/a")).await.unwrap() >= 6);
        let v = take(store.advance(&key("books/a"), 1, 1).await.unwrap());
        assert!(v.first > 6, "{v:?}");
    }
    // A namespace whose last key was deleted frees a namespace slot.
    store.delete_key(&key("chats/x")).await.unwrap();
    store.advance(&key("users/u"), 1, 1).await.unwrap();
    let err = store.advance(&key("chats/y"), 1, 1).await.unwrap_err();
    assert_limit(&err, "strict.max_namespaces");
}

const STRICT_LIMITS: StrictLimits = StrictLimits {
    max_keys_per_namespace: 2,
    max_namespaces: 2,
};

#[tokio::test]
async fn embedded_tag_limit_refuses_the_next_and_deleting_frees_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = EmbeddedStore::create(&path, "L").unwrap();
    tag_limit_contract(&store).await;
    // The count is durable: a reopened file is still full.
    drop(store);
    let store = EmbeddedStore::open(&path, "L", false).unwrap();
    let err = store
        .create_tag(&tag("z"), &record(), CreateTag::limited(3))
        .await
        .unwrap_err();
    assert_limit(&err, "segment.max_tags");
    store
        .create_tag(&tag("z"), &record(), CreateTag::limited(4))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_tag_limit_refuses_the_next_and_deleting_frees_a_slot() {
    let consul = consul().await;
    let store = ConsulSegmentStore::new(consul::client(&consul, Duration::from_secs(5), 0), keys());
    tag_limit_contract(&store).await;
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_strict_limits_and_delete_never_repeat_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store =
        EmbeddedStrictStore::with_limits(EmbeddedStore::create(&path, "L").unwrap(), STRICT_LIMITS);
    strict_contract(&store).await;
    let before = store.current(&key("books/a")).await.unwrap();
    // Tombstones and counts are durable.
    store.delete_key(&key("books/a")).await.unwrap();
    drop(store);
    let store = EmbeddedStrictStore::with_limits(
        EmbeddedStore::open(&path, "L", false).unwrap(),
        STRICT_LIMITS,
    );
    let v = store.advance(&key("books/a"), 1, 1).await.unwrap();
    assert_eq!(v.first, before + 1);
    let err = store.advance(&key("books/c"), 1, 1).await.unwrap_err();
    assert_limit(&err, "strict.max_keys_per_namespace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_strict_limits_and_delete_never_repeat_a_value() {
    let consul = consul().await;
    let store = ConsulStrictStore::with_limits(
        consul::client(&consul, Duration::from_secs(5), 0),
        keys(),
        STRICT_LIMITS,
    );
    strict_contract(&store).await;
    consul.shutdown().await;
}

/// Deletes racing calls on the same key from two Consul nodes: every
/// value handed out is distinct (the tombstone and the counter move
/// together, and a creation fails if a delete moved the tombstone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_deletes_racing_calls_never_repeat_a_value() {
    let consul = consul().await;
    let nodes: Vec<Arc<ConsulStrictStore>> = (0..2)
        .map(|_| {
            Arc::new(ConsulStrictStore::new(
                consul::client(&consul, Duration::from_secs(5), 0),
                keys(),
            ))
        })
        .collect();
    let k = key("race/k");
    let mut tasks = Vec::new();
    for node in &nodes {
        let (node, k) = (Arc::clone(node), k.clone());
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..40 {
                match node.advance(&k, 1, 2).await {
                    Ok(v) => got.extend(v.iter()),
                    Err(StoreError::Contended(_)) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
            got
        }));
    }
    let deleter = {
        let (node, k) = (Arc::clone(&nodes[1]), k.clone());
        tokio::spawn(async move {
            let mut deleted = 0;
            for _ in 0..20 {
                match node.delete_key(&k).await {
                    Ok(_) => deleted += 1,
                    Err(
                        StoreError::Strict(StrictError::KeyNotFound(_)) | StoreError::Contended(_),
                    ) => {}
                    Err(e) => panic!("{e:?}"),
                }
                tokio::task::yield_now().await;
            }
            deleted
        })
    };
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let deleted = deleter.await.unwrap();
    let n = all.len();
    let distinct: BTreeSet<u64> = all.into_iter().collect();
    assert_eq!(distinct.len(), n, "a value was handed out twice");
    assert!(n > 0 && deleted > 0, "{n} values, {deleted} deletes");
    consul.shutdown().await;
}

/// A key created on one node while another node deletes it in between the
/// creator's reads and its write: the creator's txn checks that the
/// tombstone did not move, fails, reads again and continues above the
/// tombstone. The creator talks to an agent that answers 1 s late (after
/// applying each request), so the delete on the other node lands between
/// its tombstone read and its write without any tight timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_a_delete_between_a_creators_read_and_write_never_repeats_a_value() {
    let consul = consul().await;
    let slow = consul.add_agent("slow").await.unwrap();
    let creator = Arc::new(ConsulStrictStore::new(
        ConsulClient::new(ConsulConfig {
            address: format!("http://{slow}"),
            timeout: Duration::from_secs(10),
            retries: 0,
            ..ConsulConfig::default()
        })
        .unwrap(),
        keys(),
    ));
    let other = ConsulStrictStore::new(consul::client(&consul, Duration::from_secs(5), 0), keys());
    let k = key("race/k");
    consul.faults().delay("slow", Some(Duration::from_secs(1)));
    let call = {
        let (creator, k) = (Arc::clone(&creator), k.clone());
        tokio::spawn(async move { creator.advance(&k, 1, 1).await })
    };
    // Both of the creator's reads (counter: absent; tombstone: absent)
    // have been applied; its answers and its write are a second away.
    let mut reads = 0;
    for _ in 0..200 {
        reads = consul.request_count(Some("slow"), "kv");
        if reads >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(reads, 2, "the creator's two reads");
    let first = other.advance(&k, 1, 1).await.unwrap();
    assert_eq!(first.first, 1);
    assert_eq!(other.delete_key(&k).await.unwrap(), 1);
    assert_eq!(
        consul.request_count(Some("slow"), "txn"),
        0,
        "the creator wrote before the delete: the test proves nothing"
    );
    let got = call.await.unwrap().unwrap();
    assert_eq!(got.first, 2, "value 1 was handed out by the other node");
    consul.faults().delay("slow", None);
    consul.shutdown().await;
}
