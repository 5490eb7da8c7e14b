use super::*;
use crate::id::format::FormatError;
use crate::id::format::Reset;
use crate::store::kv_paths::ClusterPaths;
use crate::store::EmbeddedStore;

fn record(name: &str, template: &str) -> StoredFormat {
    StoredFormat {
        def: FormatDef::template(name, template, "UTC", Reset::Day),
        deleted: false,
        source: DefSource::Admin,
        created_ms: 1,
        updated_ms: 1,
        fresh: false,
        lua_checked: None,
    }
}

/// The contract, the same on both backends.
async fn contract(store: &dyn FormatCatalogStore) {
    let a = record("orders", "{yyyy}{MM}{dd}{seq:4}");
    store.create(&a).await.unwrap();
    store
        .create(&StoredFormat {
            lua_checked: Some("sha256:ab".into()),
            ..record("b", "{yyyy}{MM}{dd}{seq:2}")
        })
        .await
        .unwrap();
    assert!(matches!(
        store.create(&a).await,
        Err(StoreError::Format(FormatError::Exists(n))) if n == "orders"
    ));
    let listed = store.list().await.unwrap();
    let names: Vec<&str> = listed.formats.iter().map(|f| f.def.name.as_str()).collect();
    assert_eq!(names, ["b", "orders"], "sorted by name");
    // A Lua rule's check key is kept with its definition.
    let checked = StoredFormat {
        lua_checked: Some("sha256:ab".into()),
        ..record("b", "{yyyy}{MM}{dd}{seq:2}")
    };
    assert_eq!(store.get("b").await.unwrap(), Some(checked));
    let changed = store
        .change(
            "orders",
            std::sync::Arc::new(|r| {
                let mut r = r.clone();
                r.def.description = "new".into();
                r.updated_ms = 2;
                Ok(r)
            }),
        )
        .await
        .unwrap();
    assert_eq!(changed.def.description, "new");
    assert_eq!(store.get("orders").await.unwrap(), Some(changed));
    assert!(matches!(
        store
            .change("nope", std::sync::Arc::new(|r| Ok(r.clone())))
            .await,
        Err(StoreError::Format(FormatError::NotFound(_)))
    ));
    // Delete: a tombstone; never created again, never changed.
    store
        .change(
            "orders",
            std::sync::Arc::new(|r| {
                Ok(StoredFormat {
                    deleted: true,
                    updated_ms: 3,
                    ..r.clone()
                })
            }),
        )
        .await
        .unwrap();
    let refused = store.create(&a).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::Format(FormatError::Deleted { ref format, deleted_ms: 3 }) if format == "orders"),
        "{refused:?}"
    );
    assert_eq!(refused.kind(), crate::id::ErrorKind::Precondition);
    assert!(matches!(
        store
            .change("orders", std::sync::Arc::new(|r| Ok(r.clone())))
            .await,
        Err(StoreError::Format(FormatError::Deleted { .. }))
    ));
    let listed = store.list().await.unwrap();
    let live: Vec<&str> = listed.live().map(|f| f.def.name.as_str()).collect();
    assert_eq!(live, ["b"]);
    assert_eq!(listed.formats.len(), 2, "the tombstone is listed too");
}

#[tokio::test]
async fn embedded_definitions_are_durable_and_tombstones_final() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = EmbeddedStore::create(&path, "L").unwrap();
    assert!(store.list().await.unwrap().formats.is_empty());
    contract(&store).await;
    drop(store);
    let store = EmbeddedStore::open(&path, "L", false).unwrap();
    assert!(matches!(
        store.create(&record("orders", "{yyyy}{seq:9}")).await,
        Err(StoreError::Format(FormatError::Deleted { .. }))
    ));
    assert_eq!(store.list().await.unwrap().live().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_definitions_are_shared_and_tombstones_final() {
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
        .await
        .unwrap();
    let client = || crate::store::test_consul_client(consul.addr());
    let keys = ClusterPaths::new("idgen", "test");
    let store = ConsulFormatCatalogStore::new(client(), keys.clone());
    let before = consul_fingerprint(&client(), &keys).await.unwrap();
    contract(&store).await;
    let other = ConsulFormatCatalogStore::new(client(), keys.clone());
    assert_eq!(other.list().await.unwrap().formats.len(), 2);
    let after = consul_fingerprint(&client(), &keys).await.unwrap();
    assert_ne!(before, after);
    consul.shutdown().await;
}
