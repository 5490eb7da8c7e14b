use super::*;
use crate::consul::Consistency;
use crate::id::segment::SegmentError;
use crate::store::kv_paths::ClusterPaths;
use crate::store::EmbeddedStore;

fn tag(name: &str) -> Tag {
    Tag::parse(name).unwrap()
}

fn update(step: Option<u64>, description: Option<&str>, max_id: Option<u64>) -> TagUpdate {
    TagUpdate {
        step,
        description: description.map(str::to_owned),
        max_id,
    }
}

/// The admin operations' contract, the same on every backend.
async fn admin_contract(store: &dyn SegmentStore) {
    let (a, b) = (tag("b-orders"), tag("a-users"));
    store
        .create_tag(
            &a,
            &TagRecord::new(100, 10, "orders", 1).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    store
        .create_tag(
            &b,
            &TagRecord::new(0, 5, "", 1).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    let names = tag_names(store).await;
    assert_eq!(names, ["a-users", "b-orders"], "sorted by name");
    assert_eq!(store.take_range(&a, 10, 2).await.unwrap().first, 101);

    // Update: step and description; max_id only forward.
    let r = store
        .update_tag(&a, &update(Some(20), Some("new"), Some(500)), 3)
        .await
        .unwrap();
    assert_eq!((r.step, r.description.as_str(), r.max_id), (20, "new", 500));
    assert_eq!(store.get_tag(&a).await.unwrap(), Some(r));
    // The next take starts above the moved max_id (no stale cache).
    assert_eq!(store.take_range(&a, 10, 4).await.unwrap().first, 501);
    let err = store
        .update_tag(&a, &update(None, None, Some(499)), 5)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Segment(SegmentError::MaxIdBackwards {
                current: 510,
                asked: 499,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(matches!(
        store
            .update_tag(&tag("nope"), &update(Some(1), None, None), 5)
            .await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));

    // Delete: a tombstone that reads as unknown and keeps max_id.
    let tomb = store.delete_tag(&a, 6).await.unwrap();
    assert_eq!(tomb.max_id, 510);
    assert_eq!(store.get_tag(&a).await.unwrap(), None);
    assert!(matches!(
        store.take_range(&a, 10, 7).await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));
    assert!(matches!(
        store.delete_tag(&a, 7).await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));
    assert!(matches!(
        store.update_tag(&a, &update(Some(1), None, None), 7).await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));
    let names = tag_names(store).await;
    assert_eq!(names, ["a-users"]);
    recreate_contract(store, &a, &b).await;
}

async fn tag_names(store: &dyn SegmentStore) -> Vec<String> {
    let listed = store.list_tags().await.unwrap().tags;
    listed.into_iter().map(|(t, _)| t.to_string()).collect()
}

/// A tag created again continues above its tombstone (`a` deleted at
/// max_id 510, `b` live).
async fn recreate_contract(store: &dyn SegmentStore, a: &Tag, b: &Tag) {
    let (a, b) = (a.clone(), b.clone());
    // Created again: continues above the tombstone, whatever it asks.
    let again = store
        .create_tag(
            &a,
            &TagRecord::new(0, 7, "again", 8).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    assert_eq!((again.max_id, again.step, again.deleted), (510, 7, false));
    assert_eq!(store.take_range(&a, 7, 9).await.unwrap().first, 511);
    assert!(matches!(
        store
            .create_tag(
                &a,
                &TagRecord::new(0, 7, "", 9).unwrap(),
                CreateTag::UNLIMITED
            )
            .await,
        Err(StoreError::Segment(SegmentError::TagExists(_)))
    ));
    // Asking for more than the tombstone's max_id is honoured.
    store.delete_tag(&b, 10).await.unwrap();
    let higher = store
        .create_tag(
            &b,
            &TagRecord::new(1000, 5, "", 11).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    assert_eq!(higher.max_id, 1000);
}

#[tokio::test]
async fn embedded_admin_changes_never_move_ids_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = EmbeddedStore::create(&path, "L").unwrap();
    assert!(store.list_tags().await.unwrap().tags.is_empty());
    admin_contract(&store).await;
    // Tombstones are durable.
    store.delete_tag(&tag("a-users"), 20).await.unwrap();
    drop(store);
    let store = EmbeddedStore::open(&path, "L", false).unwrap();
    assert_eq!(store.get_tag(&tag("a-users")).await.unwrap(), None);
    let back = store
        .create_tag(
            &tag("a-users"),
            &TagRecord::new(0, 5, "", 21).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    assert_eq!(back.max_id, 1000);
}

/// Issue 34 item 5: the one create says by its options what the four
/// creates did by their names: an explicit create revives a deleted tag
/// above its old IDs, auto-creation refuses it, a limit counts live tags.
#[tokio::test]
async fn create_options_say_how_a_tag_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
    let t = tag("gone");
    let record = |step| TagRecord::new(0, step, "", 1).unwrap();
    assert_eq!(CreateTag::default(), CreateTag::UNLIMITED);
    store
        .create_tag(&t, &record(10), CreateTag::default())
        .await
        .unwrap();
    let taken = store.take_range(&t, 10, 2).await.unwrap();
    store.delete_tag(&t, 3).await.unwrap();
    let auto = store.create_tag(&t, &record(10), CreateTag::auto(10)).await;
    assert!(
        matches!(
            auto,
            Err(StoreError::Segment(SegmentError::TagDeleted { .. }))
        ),
        "auto-creation leaves a deleted tag deleted: {auto:?}"
    );
    let limited = store
        .create_tag(&t, &record(10), CreateTag::limited(1))
        .await;
    let revived = limited.expect("an explicit create revives it");
    assert_eq!(revived.max_id, taken.last, "above every old ID");
    let full = store
        .create_tag(&tag("more"), &record(10), CreateTag::limited(1))
        .await;
    assert!(
        matches!(
            full,
            Err(StoreError::Segment(SegmentError::LimitReached(_)))
        ),
        "one live tag of at most one: {full:?}"
    );
    let unlimited = store
        .create_tag(&tag("more"), &record(10), CreateTag::UNLIMITED)
        .await;
    assert!(unlimited.is_ok(), "no limit: {unlimited:?}");
}

#[tokio::test]
async fn one_unreadable_record_is_reported_and_the_other_tags_still_list() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
    store
        .create_tag(
            &tag("orders"),
            &TagRecord::new(0, 5, "", 1).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    let txn = store.db().begin_write().unwrap();
    txn.open_table(SEGMENTS)
        .unwrap()
        .insert("broken", b"{not json".as_slice())
        .unwrap();
    txn.commit().unwrap();
    let listed = store.list_tags().await.unwrap();
    assert_eq!(listed.tags.len(), 1, "{listed:?}");
    assert_eq!(listed.tags[0].0.as_str(), "orders");
    assert_eq!(listed.unreadable.len(), 1, "{listed:?}");
    assert_eq!(listed.unreadable[0].0, "broken");
    assert!(
        listed.unreadable[0].1.contains("restore it from a backup"),
        "{listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_admin_changes_never_move_ids_back() {
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
        .await
        .unwrap();
    let client = || crate::store::test_consul_client(consul.addr());
    let keys = ClusterPaths::new("idgen", "test");
    let store = ConsulSegmentStore::new(client(), keys.clone());
    assert!(store.list_tags().await.unwrap().tags.is_empty());
    admin_contract(&store).await;
    // Another node's cached record cannot take below an admin change:
    // its compare-and-set fails and it re-reads.
    let other = ConsulSegmentStore::new(client(), keys.clone());
    let t = tag("shared");
    store
        .create_tag(
            &t,
            &TagRecord::new(0, 10, "", 1).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    assert_eq!(other.take_range(&t, 10, 1).await.unwrap().first, 1);
    store
        .update_tag(&t, &update(None, None, Some(1000)), 2)
        .await
        .unwrap();
    assert_eq!(other.take_range(&t, 10, 3).await.unwrap().first, 1001);
    store.delete_tag(&t, 4).await.unwrap();
    assert!(matches!(
        other.take_range(&t, 10, 5).await,
        Err(StoreError::Segment(SegmentError::TagNotFound(_)))
    ));
    // A key outside the tag alphabet, and a record that is not JSON,
    // are reported beside the readable tags, not instead of them.
    client()
        .kv_put(
            "idgen/test/segments/Not A Tag",
            b"{}",
            crate::consul::KvWrite::Set,
        )
        .await
        .unwrap();
    client()
        .kv_put(
            "idgen/test/segments/garbled",
            b"{not json",
            crate::consul::KvWrite::Set,
        )
        .await
        .unwrap();
    let listed = store.list_tags().await.unwrap();
    assert!(listed.tags.iter().all(|(t, _)| t.as_str() != "shared"));
    assert_eq!(listed.tags.len(), 2, "{listed:?}");
    let unreadable: Vec<&str> = listed.unreadable.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        unreadable,
        [
            "idgen/test/segments/Not A Tag",
            "idgen/test/segments/garbled"
        ],
        "{listed:?}"
    );
    assert!(listed.unreadable[1].1.contains("unreadable"), "{listed:?}");
    consul.shutdown().await;
}

/// The mark check of every counter txn: a mark its keeper moved on is
/// re-read and the take retried; a mark below the node's own write (a
/// restore) refuses the take, though the tag's own record is intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_retries_past_its_keepers_mark_write_and_refuses_a_mark_gone_back() {
    use crate::consul::KvWrite;
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
        .await
        .unwrap();
    let client = crate::store::test_consul_client(consul.addr());
    let keys = ClusterPaths::new("idgen", "test");
    let store = ConsulSegmentStore::new(client.clone(), keys.clone());
    let t = tag("marked");
    store
        .create_tag(
            &t,
            &TagRecord::new(0, 10, "", 1).unwrap(),
            CreateTag::UNLIMITED,
        )
        .await
        .unwrap();
    let mark = "idgen/test/hwm/0/1";
    let put = |v: &'static str| {
        let client = client.clone();
        async move { client.kv_put(mark, v.as_bytes(), KvWrite::Set).await }
    };
    put("100").await.unwrap();
    let (entry, _) = client.kv_get(mark, Consistency::Consistent).await.unwrap();
    keys.mark_at(mark, entry.unwrap().modify_index);
    keys.written().wrote(mark, (0, 100));
    assert_eq!(store.take_range(&t, 10, 2).await.unwrap().first, 1);
    // The keeper writes a higher mark: the take re-reads it and goes on.
    put("200").await.unwrap();
    keys.written().wrote(mark, (0, 200));
    assert_eq!(store.take_range(&t, 10, 3).await.unwrap().first, 11);
    // The mark goes back below the node's write: refused.
    put("150").await.unwrap();
    let err = store.take_range(&t, 10, 4).await.unwrap_err().to_string();
    assert!(
        err.contains(mark) && err.contains("idgen admin skip-ahead"),
        "{err}"
    );
    consul.shutdown().await;
}
