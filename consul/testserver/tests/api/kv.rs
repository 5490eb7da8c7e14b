//! KV semantics: cas, identical writes, shapes, indexes, limits, deletes.

use serde_json::{json, Value};

use crate::support::{b64, start};

#[tokio::test]
async fn cas_zero_creates_only() {
    let (_consul, api) = start().await;
    let r = api.put("kv/idgen/a?cas=0", "first").await;
    assert_eq!((r.status, r.text.as_str()), (200, "true"));
    let r = api.put("kv/idgen/a?cas=0", "second").await;
    assert_eq!((r.status, r.text.as_str()), (200, "false"));
    assert_eq!(api.entry("idgen/a").await["Value"], json!(b64("first")));
}

#[tokio::test]
async fn cas_n_needs_the_current_modify_index() {
    let (consul, api) = start().await;
    api.put("kv/k", "v1").await;
    let modify = api.entry("k").await["ModifyIndex"].as_u64().unwrap_or(0);
    let r = api
        .put(&format!("kv/k?cas={}", modify + 100), "stale")
        .await;
    assert_eq!(r.text, "false");
    let r = api.put(&format!("kv/k?cas={modify}"), "v2").await;
    assert_eq!(r.text, "true");
    let entry = consul.kv_get("k").unwrap_or_else(|| panic!("k is gone"));
    assert_eq!(entry.value, b"v2");
    assert!(entry.modify_index > modify);
    let r = api.put(&format!("kv/k?cas={modify}"), "v3").await;
    assert_eq!(r.text, "false", "the old index is stale now");
}

#[tokio::test]
async fn identical_write_returns_true_without_bumping_modify_index() {
    let (consul, api) = start().await;
    api.put("kv/same", "x").await;
    let before = api.entry("same").await["ModifyIndex"].clone();
    let index = consul.index();
    let r = api.put("kv/same", "x").await;
    assert_eq!(r.text, "true");
    assert_eq!(api.entry("same").await["ModifyIndex"], before);
    assert_eq!(consul.index(), index, "no write happened");
    api.put("kv/same", "y").await;
    assert_ne!(api.entry("same").await["ModifyIndex"], before);
}

#[tokio::test]
async fn get_shapes_and_index_headers() {
    let (_consul, api) = start().await;
    api.put("kv/p/a?flags=42", "hello").await;
    api.put("kv/p/b", "").await;
    api.put("kv/p/sub/c", "c").await;

    let r = api.get("kv/p/a").await;
    assert_eq!(r.status, 200);
    let entry = &r.json()[0];
    assert_eq!(entry["Key"], "p/a");
    assert_eq!(entry["Flags"], 42);
    assert_eq!(entry["Value"], json!(b64("hello")));
    assert_eq!(entry["LockIndex"], 0);
    assert!(
        entry.get("Session").is_none(),
        "unlocked keys have no Session"
    );
    assert_eq!(Some(r.index), entry["ModifyIndex"].as_u64());
    assert_eq!(r.known_leader.as_deref(), Some("true"));
    assert_eq!(r.last_contact.as_deref(), Some("0"));
    assert_eq!(api.entry("p/b").await["Value"], Value::Null);

    let raw = api.get("kv/p/a?raw").await;
    assert_eq!(raw.text, "hello");

    let missing = api.get("kv/p/nope").await;
    assert_eq!(missing.status, 404);
    let table_index = api.entry("p/sub/c").await["ModifyIndex"].as_u64();
    assert_eq!(
        Some(missing.index),
        table_index,
        "KV table index when missing"
    );

    let all = api.get("kv/p/?recurse").await.json();
    assert_eq!(all.as_array().map(Vec::len), Some(3));
    let keys = api.get("kv/p/?keys&separator=/").await.json();
    assert_eq!(keys, json!(["p/a", "p/b", "p/sub/"]));
    assert_eq!(api.get("kv/q/?recurse").await.status, 404);
    assert_eq!(api.get("kv/q/?keys").await.status, 404);
}

#[tokio::test]
async fn bad_parameters_are_rejected() {
    let (_consul, api) = start().await;
    let r = api.get("kv/k?stale&consistent").await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(api.put("kv/k?cas=0&acquire=abc", "v").await.status, 400);
    assert_eq!(api.put("kv/k?acquire=a&release=a", "v").await.status, 400);
    assert_eq!(api.put("kv/k?cas=x", "v").await.status, 400);
    assert_eq!(api.put("kv//leading", "v").await.status, 400);
    assert_eq!(api.put("kv/a..b", "v").await.status, 400);
    assert_eq!(api.get("kv/a..b").await.status, 400);
    let big = vec![b'x'; 512 * 1024 + 1];
    assert_eq!(api.put("kv/big", big).await.status, 413);
    let max = vec![b'x'; 512 * 1024];
    assert_eq!(api.put("kv/big", max).await.text, "true");
}

#[tokio::test]
async fn deletes() {
    let (consul, api) = start().await;
    let r = api.delete("kv/missing?cas=5").await;
    assert_eq!(r.text, "true", "cas delete of a missing key is true");
    api.put("kv/d/1", "1").await;
    api.put("kv/d/2", "2").await;
    api.put("kv/e", "e").await;
    let modify = api.entry("d/1").await["ModifyIndex"].as_u64().unwrap_or(0);
    assert_eq!(
        api.delete(&format!("kv/d/1?cas={}", modify + 1)).await.text,
        "false"
    );
    assert!(consul.kv_get("d/1").is_some());
    assert_eq!(
        api.delete(&format!("kv/d/1?cas={modify}")).await.text,
        "true"
    );
    assert!(consul.kv_get("d/1").is_none());
    assert_eq!(api.delete("kv/d?recurse").await.text, "true");
    assert!(consul.kv_get("d/2").is_none());
    assert!(consul.kv_get("e").is_some());
    assert_eq!(api.delete("kv/e").await.text, "true");
    assert!(consul.kv_get("e").is_none());
}

/// Consul's query meta (`X-Consul-Index`, `-KnownLeader`, `-LastContact`)
/// comes with served reads only, a 404 of a missing key included; a write
/// or an error carries none, so a client cannot lean on it there.
#[tokio::test]
async fn index_headers_come_with_reads_only() {
    let (_consul, api) = start().await;
    let put = api.put("kv/m", "v").await;
    assert_eq!(put.status, 200);
    assert_eq!((put.index, put.known_leader.as_deref()), (0, None));
    let txn = api.put("txn", "[]").await;
    assert_eq!((txn.status, txn.index), (200, 0));
    let read = api.get("kv/m").await;
    assert!(read.index > 0);
    assert_eq!(read.known_leader.as_deref(), Some("true"));
    let missing = api.get("kv/none").await;
    assert_eq!(missing.status, 404);
    assert!(missing.index > 0);
    let bad = api.get("kv/m?index=x").await;
    assert_eq!((bad.status, bad.index), (400, 0));
}
