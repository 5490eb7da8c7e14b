//! Segment records on both backends: ranges are disjoint and gap-free
//! under concurrent takers, durable, and never reused after a write whose
//! outcome was unknown.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::consul;
use consul_testserver::{Config, TestConsul};
use idgen::id::segment::SegmentError;
use idgen::id::segment::{Range, Tag, TagRecord};
use idgen::store::kv_paths::ClusterPaths;
use idgen::store::{ConsulSegmentStore, CreateTag, EmbeddedStore, SegmentStore, StoreError};

fn tag(name: &str) -> Tag {
    Tag::parse(name).unwrap()
}

/// Every range disjoint from every other, and together exactly
/// `first..=first + total - 1`.
fn assert_disjoint_and_contiguous(mut ranges: Vec<Range>, first: u64) -> u64 {
    ranges.sort_by_key(|r| r.first);
    let mut next = first;
    for r in &ranges {
        assert_eq!(r.first, next, "gap or overlap at {r:?}");
        next = r.last + 1;
    }
    next - 1
}

async fn hammer(
    stores: Vec<Arc<dyn SegmentStore>>,
    t: &Tag,
    takers: usize,
    takes: usize,
) -> Vec<Range> {
    let mut tasks = Vec::new();
    for i in 0..takers {
        let store = Arc::clone(&stores[i % stores.len()]);
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for j in 0..takes {
                let step = 10 + ((i + j) % 7) as u64;
                got.push(store.take_range(&t, step, 1).await.expect("take"));
            }
            got
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_ranges_are_disjoint_gap_free_and_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = EmbeddedStore::create(&path, "layout").unwrap();
    let t = tag("orders");
    assert!(store.get_tag(&t).await.unwrap().is_none());
    assert!(matches!(
        store.take_range(&t, 10, 1).await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));
    let record = TagRecord::new(1000, 100, "order numbers", 1).unwrap();
    store
        .create_tag(&t, &record, CreateTag::UNLIMITED)
        .await
        .unwrap();
    assert!(matches!(
        store.create_tag(&t, &record, CreateTag::UNLIMITED).await,
        Err(StoreError::Segment(SegmentError::TagExists(_)))
    ));
    let stores: Vec<Arc<dyn SegmentStore>> = vec![Arc::new(store.clone())];
    let ranges = hammer(stores, &t, 8, 25).await;
    let last = assert_disjoint_and_contiguous(ranges, 1001);
    assert_eq!(store.get_tag(&t).await.unwrap().unwrap().max_id, last);
    drop(store);
    // Reopened (a restart): the next range starts above everything taken.
    let store = EmbeddedStore::open(&path, "layout", false).unwrap();
    let r = store.take_range(&t, 5, 2).await.unwrap();
    assert_eq!(r.first, last + 1);
    let rec = store.get_tag(&t).await.unwrap().unwrap();
    assert_eq!(
        (rec.step, rec.description.as_str(), rec.created_ms),
        (100, "order numbers", 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_ranges_from_three_nodes_are_disjoint_and_gap_free() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let keys = ClusterPaths::new("idgen", "test");
    let nodes: Vec<Arc<dyn SegmentStore>> = (0..3)
        .map(|_| {
            Arc::new(ConsulSegmentStore::new(
                consul::client(&consul, Duration::from_secs(2), 0),
                keys.clone(),
            )) as Arc<dyn SegmentStore>
        })
        .collect();
    let t = tag("invoices");
    nodes[0]
        .create_tag(
            &t,
            &TagRecord::new(0, 50, "", 1).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    assert!(matches!(
        nodes[1]
            .create_tag(
                &t,
                &TagRecord::new(0, 50, "", 1).unwrap(),
                CreateTag::UNLIMITED
            )
            .await,
        Err(StoreError::Segment(SegmentError::TagExists(_)))
    ));
    assert!(matches!(
        nodes[2].take_range(&tag("nope"), 10, 1).await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));
    let ranges = hammer(nodes.clone(), &t, 6, 30).await;
    let last = assert_disjoint_and_contiguous(ranges, 1);
    let stored = nodes[2].get_tag(&t).await.unwrap().unwrap();
    assert_eq!(stored.max_id, last);
    let kv = consul
        .kv_get("idgen/test/segments/invoices")
        .expect("record in KV");
    let json: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
    assert_eq!(json["max_id"].as_u64(), Some(last));
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consul_take_with_an_unknown_outcome_is_never_reused() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let keys = ClusterPaths::new("idgen", "test");
    let store =
        ConsulSegmentStore::new(consul::client(&consul, Duration::from_millis(300), 0), keys);
    let t = tag("slow");
    store
        .create_tag(
            &t,
            &TagRecord::new(0, 10, "", 1).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    let first = store.take_range(&t, 10, 1).await.unwrap();
    assert_eq!(first, Range { first: 1, last: 10 });
    // Answers come too late: the write is applied, the client times out.
    consul
        .faults()
        .delay("agent-0", Some(Duration::from_millis(800)));
    assert!(store.take_range(&t, 10, 1).await.is_err());
    consul.faults().delay("agent-0", None);
    tokio::time::sleep(Duration::from_millis(900)).await;
    // Applied on the server, so 11..=20 is gone: the next take re-reads
    // and starts above it instead of handing 11..=20 out.
    let next = store.take_range(&t, 10, 1).await.unwrap();
    assert_eq!(
        next,
        Range {
            first: 21,
            last: 30
        }
    );
    consul.shutdown().await;
}

/// Deletes `t` (which has handed out IDs), then checks on `store` that
/// auto-creation is refused as deleted without touching the tombstone,
/// and that an explicit create continues above every old ID.
async fn deleted_stays_deleted(store: &dyn SegmentStore, t: &Tag) {
    store
        .create_tag(
            t,
            &TagRecord::new(0, 40, "kept settings", 1).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    let taken = store.take_range(t, 40, 2).await.unwrap();
    let tombstone = store.delete_tag(t, 5_000).await.unwrap();
    assert_eq!(tombstone.max_id, taken.last);
    for _ in 0..2 {
        let err = store
            .create_tag(
                t,
                &TagRecord::new(0, 500, "auto-created", 6).unwrap(),
                CreateTag::auto(100),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                StoreError::Segment(SegmentError::TagDeleted {
                    deleted_ms: 5_000,
                    ..
                })
            ),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("was deleted at"), "{text}");
        assert!(text.contains("idgen admin tags create"), "{text}");
    }
    // Still deleted: nothing to take.
    assert!(store.get_tag(t).await.unwrap().is_none());
    assert!(matches!(
        store.take_range(t, 10, 7).await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));
    // An explicit create revives it above the old IDs.
    let revived = store
        .create_tag(
            t,
            &TagRecord::new(0, 40, "again", 8).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    assert_eq!(revived.max_id, taken.last);
    let next = store.take_range(t, 40, 9).await.unwrap();
    assert_eq!(next.first, taken.last + 1);
    // A never-deleted tag is still auto-created.
    let fresh = tag("fresh");
    let made = store
        .create_tag(
            &fresh,
            &TagRecord::new(0, 500, "auto-created", 6).unwrap(),
            CreateTag::auto(100),
        )
        .await
        .unwrap();
    assert_eq!(made.max_id, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_create_refuses_a_deleted_tag_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedStore::create(&dir.path().join("s.redb"), "layout").unwrap();
    deleted_stays_deleted(&embedded, &tag("gone")).await;

    let consul = TestConsul::start(Config::default()).await.unwrap();
    let store = ConsulSegmentStore::new(
        consul::client(&consul, Duration::from_secs(2), 0),
        ClusterPaths::new("idgen", "test"),
    );
    deleted_stays_deleted(&store, &tag("gone")).await;
    consul.shutdown().await;
}
