//! Sessions and locks: acquire/release, LockIndex, lock-delay, TTL expiry,
//! destroy, Behavior delete, check binding.

use std::time::{Duration, Instant};

use consul_testserver::Config;
use serde_json::json;

use crate::support::{eventually, start, start_with};

#[tokio::test]
async fn acquire_release_and_lock_index() {
    let (consul, api) = start().await;
    let s1 = api.session(json!({"Name": "one", "LockDelay": "0s"})).await;
    let s2 = api.session(json!({"Name": "two"})).await;

    assert_eq!(
        api.put(&format!("kv/lock?acquire={s1}"), "v1").await.text,
        "true"
    );
    let entry = api.entry("lock").await;
    assert_eq!(entry["LockIndex"], 1);
    assert_eq!(entry["Session"], json!(s1));
    assert_eq!(
        api.put(&format!("kv/lock?acquire={s1}"), "v1b").await.text,
        "true"
    );
    assert_eq!(
        api.entry("lock").await["LockIndex"],
        1,
        "same holder: no new LockIndex"
    );

    assert_eq!(
        api.put(&format!("kv/lock?acquire={s2}"), "x").await.text,
        "false"
    );
    assert_eq!(
        api.put(&format!("kv/lock?release={s2}"), "x").await.text,
        "false"
    );
    let before = api.entry("lock").await["ModifyIndex"].as_u64().unwrap_or(0);
    assert_eq!(
        api.put(&format!("kv/lock?release={s1}"), "released")
            .await
            .text,
        "true"
    );
    let entry = api.entry("lock").await;
    assert!(entry.get("Session").is_none());
    assert_eq!(entry["LockIndex"], 1, "release keeps LockIndex");
    assert!(entry["ModifyIndex"].as_u64().unwrap_or(0) > before);
    assert_eq!(
        consul.kv_get("lock").map(|e| e.value),
        Some(b"released".to_vec())
    );

    assert_eq!(
        api.put(&format!("kv/lock?acquire={s2}"), "v2").await.text,
        "true"
    );
    assert_eq!(api.entry("lock").await["LockIndex"], 2);

    let r = api.put("kv/lock?acquire=no-such-session", "v").await;
    assert_eq!(r.status, 500);
    assert_eq!(r.text, "invalid session \"no-such-session\"");
}

#[tokio::test]
async fn lock_delay_blocks_acquire_after_destroy_then_allows_it() {
    let (consul, api) = start().await;
    let s1 = api.session(json!({"LockDelay": "700ms"})).await;
    let s2 = api.session(json!({})).await;
    api.put(&format!("kv/ld?acquire={s1}"), "held").await;
    let modify = api.entry("ld").await["ModifyIndex"].as_u64().unwrap_or(0);

    assert_eq!(
        api.put(&format!("session/destroy/{s1}"), "").await.text,
        "true"
    );
    assert_eq!(
        api.put(&format!("session/destroy/{s1}"), "").await.text,
        "true",
        "idempotent"
    );
    let entry = api.entry("ld").await;
    assert!(entry.get("Session").is_none());
    assert!(entry["ModifyIndex"].as_u64().unwrap_or(0) > modify);
    assert_eq!(consul.kv_get("ld").map(|e| e.value), Some(b"held".to_vec()));

    let destroyed_at = Instant::now();
    assert_eq!(
        api.put(&format!("kv/ld?acquire={s2}"), "mine").await.text,
        "false"
    );
    let s2 = s2.clone();
    let api2 = api.clone();
    eventually(Duration::from_secs(3), "acquire after lock-delay", || {
        let (api, s2) = (api2.clone(), s2.clone());
        async move { api.put(&format!("kv/ld?acquire={s2}"), "mine").await.text == "true" }
    })
    .await;
    assert!(destroyed_at.elapsed() >= Duration::from_millis(600));
}

#[tokio::test]
async fn ttl_expiry_lands_between_ttl_and_twice_ttl_and_releases_locks() {
    let (consul, api) = start().await;
    let id = api
        .session(json!({"TTL": "500ms", "LockDelay": "0s", "Name": "ttl"}))
        .await;
    assert_eq!(
        api.put(&format!("kv/t?acquire={id}"), "v").await.text,
        "true"
    );
    // The server renews somewhere between `sent` and `renewed_at`, so
    // the session is due at least 2 x TTL after `sent` and at most 2 x TTL
    // after `renewed_at`. The bounds below follow from that alone, however
    // late a loaded machine wakes this test.
    let sent = Instant::now();
    let renewed = api.put(&format!("session/renew/{id}"), "").await;
    assert_eq!(renewed.status, 200);
    assert_eq!(renewed.json()[0]["TTL"], "500ms");
    let renewed_at = Instant::now();

    tokio::time::sleep_until((renewed_at + Duration::from_millis(700)).into()).await;
    // Past TTL since the renewal (700 ms after `renewed_at`): alive, unless
    // this check ended 2 x TTL after `sent` or later (a late wake-up).
    let alive = consul.sessions().iter().any(|s| s.id == id);
    if sent.elapsed() < Duration::from_millis(1000) {
        assert!(alive, "expired past TTL, before 2 x TTL");
    }
    let consul2 = consul.clone();
    eventually(Duration::from_secs(10), "session expiry", || {
        let consul = consul2.clone();
        let id = id.clone();
        async move { !consul.sessions().iter().any(|s| s.id == id) }
    })
    .await;
    assert!(
        sent.elapsed() >= Duration::from_millis(1000),
        "expired before 2 x TTL after the renewal"
    );
    assert_eq!(consul.kv_get("t").and_then(|e| e.session), None);
    let r = api.put(&format!("session/renew/{id}"), "").await;
    assert_eq!(r.status, 404);
    assert_eq!(
        api.get(&format!("session/info/{id}")).await.json(),
        json!([])
    );
}

#[tokio::test]
async fn ttl_factor_one_expires_at_ttl() {
    let config = Config {
        ttl_expiry_factor: 1.0,
        ..crate::support::fast_config()
    };
    let (consul, api) = start_with(config).await;
    // Sent before the server creates it: due no sooner than 300 ms after.
    let sent = Instant::now();
    let id = api.session(json!({"TTL": "300ms"})).await;
    let consul2 = consul.clone();
    eventually(Duration::from_secs(2), "expiry", || {
        let consul = consul2.clone();
        async move { consul.sessions().is_empty() }
    })
    .await;
    // No upper bound: a loaded machine may see it late (the `eventually`
    // bounds the wait).
    let took = sent.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert_eq!(
        api.put(&format!("session/renew/{id}"), "").await.status,
        404
    );
}

#[tokio::test]
async fn behavior_delete_removes_held_keys() {
    let (consul, api) = start().await;
    let id = api.session(json!({"Behavior": "delete"})).await;
    api.put(&format!("kv/eph?acquire={id}"), "x").await;
    api.put("kv/keep", "y").await;
    api.put(&format!("session/destroy/{id}"), "").await;
    assert!(consul.kv_get("eph").is_none());
    assert!(consul.kv_get("keep").is_some());
}

#[tokio::test]
async fn create_validation_info_and_list() {
    let (consul, api) = start_with(Config::default()).await;
    // Out of [10s, 24h]: an RPC error in Consul, so 500, with the TTL in
    // nanoseconds.
    let r = api.put_json("session/create", json!({"TTL": "5s"})).await;
    assert_eq!(r.status, 500, "{}", r.text);
    assert_eq!(
        r.text,
        "Invalid Session TTL '5000000000', must be between [10s=24h0m0s]"
    );
    let r = api
        .put_json("session/create", json!({"TTL": "86401s"}))
        .await;
    assert_eq!(r.status, 500, "{}", r.text);
    assert!(
        r.text.starts_with("Invalid Session TTL '86401000000000'"),
        "{}",
        r.text
    );
    assert_eq!(
        api.put_json("session/create", json!({"TTL": "10s"}))
            .await
            .status,
        200,
        "10 s is the default minimum"
    );
    assert_eq!(
        api.put_json("session/create", json!({"TTL": "24h"}))
            .await
            .status,
        200
    );
    assert_eq!(
        api.put_json("session/create", json!({"TTL": "ten"}))
            .await
            .status,
        400,
        "an unparsable TTL is a decode error"
    );
    assert_eq!(
        api.put_json("session/create", json!({"Behavior": "keep"}))
            .await
            .status,
        400
    );
    let r = api
        .put_json("session/create", json!({"NodeChecks": ["nope"]}))
        .await;
    assert_eq!(r.status, 500, "{}", r.text);

    // Lower-case field names, as py-consul sends them; LockDelay clamped to 60s.
    let id = api
        .session(json!({"name": "lc", "ttl": "10s", "lockdelay": "90s", "behavior": "delete"}))
        .await;
    let info = api.get(&format!("session/info/{id}")).await.json();
    assert_eq!(info[0]["Name"], "lc");
    assert_eq!(info[0]["TTL"], "10s");
    assert_eq!(info[0]["Behavior"], "delete");
    assert_eq!(info[0]["Node"], "agent-0");
    assert_eq!(info[0]["NodeChecks"], json!(["serfHealth"]));
    assert_eq!(info[0]["LockDelay"], json!(60_000_000_000u64));
    let empty = api.session(json!({})).await;
    let list = api.get("session/list").await.json();
    assert_eq!(list.as_array().map(Vec::len), Some(4));
    assert_eq!(consul.sessions().len(), 4);
    let info = api.get(&format!("session/info/{empty}")).await.json();
    assert_eq!(
        info[0]["LockDelay"],
        json!(15_000_000_000u64),
        "default 15s"
    );
    assert_eq!(info[0]["TTL"], "");
}

#[tokio::test]
async fn bound_check_critical_refuses_then_invalidates() {
    let (consul, api) = start().await;
    let register = json!({
        "Name": "idgen", "ID": "idgen-1",
        "Check": {"CheckID": "idgen-1:ttl", "TTL": "30s"}
    });
    assert_eq!(
        api.put_json("agent/service/register", register)
            .await
            .status,
        200
    );
    let body = json!({"ServiceChecks": [{"ID": "idgen-1:ttl"}]});
    let r = api.put_json("session/create", body.clone()).await;
    assert_eq!(r.status, 500, "a new TTL check is critical: {}", r.text);
    assert!(r.text.contains("critical"), "{}", r.text);

    api.put("agent/check/pass/idgen-1:ttl", "").await;
    let id = api.session(body).await;
    let info = api.get(&format!("session/info/{id}")).await.json();
    assert_eq!(info[0]["ServiceChecks"][0]["ID"], "idgen-1:ttl");
    api.put(&format!("kv/w?acquire={id}"), "v").await;
    api.put("agent/check/fail/idgen-1:ttl?note=down", "").await;
    assert!(consul.sessions().is_empty(), "critical check invalidates");
    assert_eq!(consul.kv_get("w").and_then(|e| e.session), None);
}

/// A lower minimum, as Consul's `session_ttl_min` server option allows.
#[tokio::test]
async fn a_lower_session_ttl_min_is_a_server_setting() {
    let (_consul, api) = start_with(Config {
        min_ttl: Duration::from_secs(1),
        ..Config::default()
    })
    .await;
    assert_eq!(
        api.put_json("session/create", json!({"TTL": "1s"}))
            .await
            .status,
        200
    );
    let r = api
        .put_json("session/create", json!({"TTL": "999ms"}))
        .await;
    assert_eq!(r.status, 500, "{}", r.text);
    assert!(
        r.text.ends_with("must be between [1s=24h0m0s]"),
        "{}",
        r.text
    );
}
