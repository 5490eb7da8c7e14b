//! Transactions: atomicity, results, errors, the operation limit.

use serde_json::{json, Value};

use crate::support::{b64, start};

fn kv(verb: &str, key: &str, value: Option<&str>, index: Option<u64>) -> Value {
    let mut op = json!({"Verb": verb, "Key": key});
    if let Some(v) = value {
        op["Value"] = json!(b64(v));
    }
    if let Some(i) = index {
        op["Index"] = json!(i);
    }
    json!({ "KV": op })
}

#[tokio::test]
async fn all_or_nothing_with_op_index() {
    let (consul, api) = start().await;
    let index = consul.index();
    let r = api
        .put_json(
            "txn",
            json!([
                kv("set", "t/a", Some("1"), None),
                kv("check-not-exists", "t/b", None, None),
                kv("cas", "t/c", Some("3"), Some(999)),
            ]),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text);
    let body = r.json();
    assert_eq!(body["Results"], Value::Null);
    assert_eq!(body["Errors"][0]["OpIndex"], 2);
    assert!(body["Errors"][0]["What"]
        .as_str()
        .unwrap_or("")
        .contains("t/c"));
    assert!(consul.kv_get("t/a").is_none(), "rolled back");
    assert_eq!(consul.index(), index);
}

#[tokio::test]
async fn cas_returns_the_new_modify_index() {
    let (consul, api) = start().await;
    let r = api
        .put_json("txn", json!([kv("cas", "w/1", Some("a"), Some(0))]))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let body = r.json();
    assert_eq!(body["Errors"], Value::Null);
    let first = body["Results"][0]["KV"]["ModifyIndex"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(consul.kv_get("w/1").map(|e| e.modify_index), Some(first));

    let r = api
        .put_json(
            "txn",
            json!([
                kv("cas", "w/1", Some("b"), Some(first)),
                kv("set", "w/2", Some("c"), None)
            ]),
        )
        .await;
    let body = r.json();
    let second = body["Results"][0]["KV"]["ModifyIndex"]
        .as_u64()
        .unwrap_or(0);
    assert!(second > first);
    assert_eq!(
        body["Results"][1]["KV"]["ModifyIndex"].as_u64(),
        Some(second),
        "one index per txn"
    );
    assert_eq!(
        body["Results"][0]["KV"]["Value"],
        Value::Null,
        "writes return no value"
    );
    assert_eq!(consul.kv_get("w/1").map(|e| e.value), Some(b"b".to_vec()));
    // The old index is stale now.
    let r = api
        .put_json("txn", json!([kv("cas", "w/1", Some("x"), Some(first))]))
        .await;
    assert_eq!(r.status, 409);
}

#[tokio::test]
async fn verbs_and_result_entries() {
    let (consul, api) = start().await;
    let session = api.session(json!({"LockDelay": "0s"})).await;
    let lock =
        json!({"KV": {"Verb": "lock", "Key": "v/lock", "Value": b64("me"), "Session": session}});
    let r = api
        .put_json(
            "txn",
            json!([
                kv("set", "v/a", Some("a"), None),
                lock,
                kv("get", "v/a", None, None),
                kv("get-or-empty", "v/none", None, None),
                kv("delete", "v/none", None, None),
                kv("get-tree", "v/", None, None),
            ]),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let results = r.json()["Results"].as_array().cloned().unwrap_or_default();
    // set, lock, get, get-or-empty, then get-tree's two entries; delete adds none.
    assert_eq!(results.len(), 6, "{results:?}");
    assert_eq!(results[1]["KV"]["Session"], json!(session));
    assert_eq!(results[1]["KV"]["LockIndex"], 1);
    assert_eq!(results[2]["KV"]["Value"], json!(b64("a")));
    assert_eq!(results[3]["KV"]["Key"], "v/none");
    assert_eq!(results[3]["KV"]["ModifyIndex"], 0);

    let unlock = json!({"KV": {"Verb": "unlock", "Key": "v/lock", "Session": "someone-else"}});
    let r = api.put_json("txn", json!([unlock])).await;
    assert_eq!(r.status, 409);
    let check = json!({"KV": {"Verb": "check-session", "Key": "v/lock", "Session": session}});
    let r = api
        .put_json("txn", json!([check, kv("delete-tree", "v/", None, None)]))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(consul.kv_get("v/a").is_none());
    let r = api
        .put_json("txn", json!([kv("delete", "v/x", None, None)]))
        .await;
    assert_eq!(
        r.json()["Results"],
        Value::Null,
        "delete verbs add no result"
    );
}

#[tokio::test]
async fn at_most_64_operations() {
    let (consul, api) = start().await;
    let ops: Vec<Value> = (0..65)
        .map(|i| kv("set", &format!("n/{i}"), Some("x"), None))
        .collect();
    let r = api.put_json("txn", Value::Array(ops.clone())).await;
    assert_eq!(r.status, 413, "{}", r.text);
    assert!(consul.kv_get("n/0").is_none());
    let r = api.put_json("txn", Value::Array(ops[..64].to_vec())).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(consul.kv_get("n/63").is_some());
}

fn lock(key: &str, session: &str) -> Value {
    json!({"KV": {"Verb": "lock", "Key": key, "Value": b64("mine"), "Session": session}})
}

/// Consul's `TestTxn_Apply_LockDelay`: a txn `lock` on a key inside its
/// lock-delay is refused (409) like `?acquire`, and works once it is over.
#[tokio::test]
async fn lock_inside_lock_delay_is_refused() {
    let (consul, api) = start().await;
    let s1 = api.session(json!({"LockDelay": "600ms"})).await;
    let s2 = api.session(json!({})).await;
    let r = api.put_json("txn", json!([lock("ld/k", &s1)])).await;
    assert_eq!(r.status, 200, "{}", r.text);
    api.put(&format!("session/destroy/{s1}"), "").await;
    let destroyed = std::time::Instant::now();

    let r = api.put_json("txn", json!([lock("ld/k", &s2)])).await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(
        r.json()["Errors"][0]["What"],
        "failed to lock key \"ld/k\" due to lock delay"
    );
    assert_eq!(consul.kv_get("ld/k").and_then(|e| e.session), None);
    // Another key is not affected.
    let r = api.put_json("txn", json!([lock("ld/other", &s2)])).await;
    assert_eq!(r.status, 200, "{}", r.text);

    let wait = std::time::Duration::from_millis(650).saturating_sub(destroyed.elapsed());
    tokio::time::sleep(wait).await;
    let r = api.put_json("txn", json!([lock("ld/k", &s2)])).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(consul.kv_get("ld/k").and_then(|e| e.session), Some(s2));
}

/// Consul's `kvsSetTxn`: a plain set or cas on a locked key keeps the
/// holder and writes LockIndex 0, over HTTP and in a txn.
#[tokio::test]
async fn set_and_cas_on_a_locked_key_reset_lock_index() {
    let (_consul, api) = start().await;
    let s = api.session(json!({})).await;
    let locked = |key: &'static str| {
        let (api, s) = (api.clone(), s.clone());
        async move {
            let r = api.put(&format!("kv/{key}?acquire={s}"), "v").await;
            assert_eq!(r.text, "true");
            assert_eq!(api.entry(key).await["LockIndex"], 1);
        }
    };
    locked("li/put").await;
    assert_eq!(api.put("kv/li/put", "plain").await.text, "true");
    locked("li/cas").await;
    let index = api.entry("li/cas").await["ModifyIndex"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        api.put(&format!("kv/li/cas?cas={index}"), "c").await.text,
        "true"
    );
    locked("li/tset").await;
    locked("li/tcas").await;
    let index = api.entry("li/tcas").await["ModifyIndex"]
        .as_u64()
        .unwrap_or(0);
    let r = api
        .put_json(
            "txn",
            json!([
                kv("set", "li/tset", Some("t"), None),
                kv("cas", "li/tcas", Some("t"), Some(index)),
            ]),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["Results"][0]["KV"]["LockIndex"], 0);
    for key in ["li/put", "li/cas", "li/tset", "li/tcas"] {
        let entry = api.entry(key).await;
        assert_eq!(entry["LockIndex"], 0, "{key}");
        assert_eq!(entry["Session"], json!(s), "{key} keeps its holder");
    }
}
