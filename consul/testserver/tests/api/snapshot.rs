//! `/v1/snapshot`: save and restore round-trip keys, indexes and sessions;
//! a restore moves indexes back but never the raft index; management
//! token only.

use consul_testserver::{Config, Policy};
use serde_json::json;

use crate::support::{fast_config, start, start_with};

#[tokio::test]
async fn save_and_restore_round_trip_keys_indexes_and_sessions() {
    let (consul, api) = start().await;
    let session = api.session(json!({"TTL": "10s"})).await;
    assert_eq!(api.put("kv/idgen/c", "10").await.text, "true");
    assert_eq!(
        api.put(&format!("kv/idgen/lock?acquire={session}"), "me")
            .await
            .text,
        "true"
    );
    let saved_c = api.entry("idgen/c").await;
    let saved_lock = api.entry("idgen/lock").await;
    let save = api.get("snapshot").await;
    assert_eq!(save.status, 200, "{}", save.text);
    assert!(save.index > 0, "X-Consul-Index on a save");
    let archive = save.text.clone().into_bytes();

    // After the snapshot: the counter moves on, a key and a session appear.
    assert_eq!(api.put("kv/idgen/c", "20").await.text, "true");
    assert_eq!(api.put("kv/idgen/new", "n").await.text, "true");
    let later = api.session(json!({})).await;
    let moved = api.entry("idgen/c").await;
    let raft_before = consul.index();

    let r = api.put("snapshot", archive).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        api.entry("idgen/c").await,
        saved_c,
        "value and indexes as saved"
    );
    assert_eq!(api.entry("idgen/lock").await, saved_lock, "still locked");
    assert_eq!(api.get("kv/idgen/new").await.status, 404);
    assert!(consul.index() > raft_before, "the raft index moves on");
    let sessions: Vec<String> = consul.sessions().into_iter().map(|s| s.id).collect();
    assert_eq!(sessions, vec![session.clone()]);
    assert_eq!(
        api.put(&format!("session/renew/{later}"), "").await.status,
        404
    );

    // A cas on the index read after the snapshot now fails; the one read
    // before it succeeds again, and the write lands above every index.
    let moved_index = moved["ModifyIndex"].as_u64().unwrap_or(0);
    let saved_index = saved_c["ModifyIndex"].as_u64().unwrap_or(0);
    assert!(moved_index > saved_index);
    let r = api
        .put(&format!("kv/idgen/c?cas={moved_index}"), "21")
        .await;
    assert_eq!(r.text, "false");
    let r = api
        .put(&format!("kv/idgen/c?cas={saved_index}"), "11")
        .await;
    assert_eq!(r.text, "true");
    let after = api.entry("idgen/c").await["ModifyIndex"]
        .as_u64()
        .unwrap_or(0);
    assert!(after > raft_before, "{after} > {raft_before}");
}

#[tokio::test]
async fn a_blocking_query_returns_at_a_restore_with_the_lower_index() {
    let (_consul, api) = start().await;
    assert_eq!(api.put("kv/k", "1").await.text, "true");
    let archive = api.get("snapshot").await.text.into_bytes();
    assert_eq!(api.put("kv/k", "2").await.text, "true");
    let index = api.get("kv/k").await.index;
    let waiter = {
        let api = api.clone();
        tokio::spawn(async move { api.get(&format!("kv/k?index={index}&wait=20s")).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(api.put("snapshot", archive).await.status, 200);
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
        .await
        .unwrap_or_else(|_| panic!("the blocking query did not return at the restore"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.index < index, "{} < {index}", r.index);
}

#[tokio::test]
async fn snapshots_need_a_management_token_and_a_real_archive() {
    let config = Config {
        acl_master_token: Some("root".into()),
        ..fast_config()
    };
    let (consul, api) = start_with(config).await;
    consul.add_token(
        "idgen",
        Policy {
            key_prefix_write: vec![String::new()],
            session_write: true,
            read_all: true,
            ..Policy::default()
        },
    );
    let idgen = api.with_token("idgen");
    assert_eq!(idgen.get("snapshot").await.status, 403);
    assert_eq!(idgen.put("snapshot", "x").await.status, 403);
    let root = api.with_token("root");
    assert_eq!(root.put("kv/k", "1").await.text, "true");
    let r = root.put("snapshot", "not an archive").await;
    assert_eq!(r.status, 500);
    assert!(r.text.contains("failed to restore snapshot"), "{}", r.text);
    assert_eq!(root.get("kv/k").await.status, 200, "nothing changed");
    assert_eq!(root.get("snapshot").await.status, 200);
}

/// What idgen's restore detection reads (docs/SAFETY-RULES-11-17.md, rule 15, "the
/// cluster's index"): a `?keys&separator=/` listing of a prefix answers
/// with the highest ModifyIndex under it (Consul `kvsListKeysTxn`), a
/// delete's tombstone included; a restore takes it back to the
/// snapshot's, and the next write lands above every earlier index.
#[tokio::test]
async fn a_prefix_listing_index_goes_back_at_a_restore_and_on_with_the_next_write() {
    let (_consul, api) = start().await;
    assert_eq!(api.put("kv/idgen/test/a", "1").await.text, "true");
    assert_eq!(api.put("kv/other/x", "1").await.text, "true");
    let listing = api.get("kv/idgen/test/?keys&separator=/&consistent").await;
    assert_eq!(listing.status, 200, "{}", listing.text);
    let a = api.entry("idgen/test/a").await["ModifyIndex"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(listing.index, a, "the prefix's own highest index");
    let save = api.get("snapshot").await;
    let archive = save.text.clone().into_bytes();
    assert_eq!(api.put("kv/idgen/test/b/c", "2").await.text, "true");
    assert_eq!(api.delete("kv/idgen/test/b/c").await.status, 200);
    let seen = api.get("kv/idgen/test/?keys&separator=/").await.index;
    assert!(seen > a, "a delete's tombstone counts: {seen} > {a}");
    assert_eq!(api.put("snapshot", archive).await.status, 200);
    let after = api.get("kv/idgen/test/?keys&separator=/").await.index;
    assert_eq!(after, a, "the restore takes it back");
    assert_eq!(api.put("kv/idgen/test/a", "2").await.text, "true");
    let next = api.get("kv/idgen/test/?keys&separator=/").await.index;
    assert!(next > seen, "the next write lands above: {next} > {seen}");
}
