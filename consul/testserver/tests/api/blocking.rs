//! Blocking queries: they return on a change, or when the wait runs out.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{client, start, Api};

/// A client that outwaits a 30 s blocking query: the tests below tell a
/// query that returned on a change from one that ran out its wait by the
/// index it answers with, not by how long it took (a loaded machine makes
/// answers slow, never early), so the wait is long and the clock is only
/// read for lower bounds.
fn patient(api: &Api) -> Api {
    Api {
        http: client(Duration::from_secs(60)),
        ..api.clone()
    }
}

#[tokio::test]
async fn kv_blocking_query_returns_on_change() {
    let (_consul, api) = start().await;
    api.put("kv/b", "1").await;
    let index = api.get("kv/b").await.index;
    let writer = api.clone();
    let write = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        writer.put("kv/b", "2").await
    });
    let started = Instant::now();
    let r = patient(&api)
        .get(&format!("kv/b?index={index}&wait=30s"))
        .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "returned before the change: {took:?}"
    );
    // A query that ran out its wait answers with the index it was given.
    assert!(r.index > index, "did not return on the change: {took:?}");
    assert_eq!(r.json()[0]["Value"], json!(crate::support::b64("2")));
    assert_eq!(write.await.map(|r| r.text).ok().as_deref(), Some("true"));
}

#[tokio::test]
async fn blocking_query_runs_out_its_wait_when_nothing_changes() {
    let (_consul, api) = start().await;
    api.put("kv/t", "1").await;
    let index = api.get("kv/t").await.index;
    // Writes elsewhere do not wake a query on another key for good.
    let started = Instant::now();
    let other = api.clone();
    tokio::spawn(async move { other.put("kv/unrelated", "x").await });
    let r = api.get(&format!("kv/t?index={index}&wait=400ms")).await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert_eq!(r.index, index, "nothing under kv/t changed");
    // Index 0 never blocks: a query that did would run out the 30 s
    // wait, far past the 10 s this allows it.
    let quick = tokio::time::timeout(
        Duration::from_secs(10),
        patient(&api).get("kv/t?index=0&wait=30s"),
    )
    .await;
    assert!(quick.is_ok(), "index 0 blocked");
}

#[tokio::test]
async fn health_blocking_query_wakes_on_status_change() {
    let (_consul, api) = start().await;
    let body = json!({"Name": "idgen", "ID": "i", "Check": {"CheckID": "c", "TTL": "30s"}});
    api.put_json("agent/service/register", body).await;
    let index = api.get("health/service/idgen").await.index;
    // A heartbeat that does not change the status is not a change.
    let r = api
        .get(&format!("health/service/idgen?index={index}&wait=200ms"))
        .await;
    assert_eq!(r.index, index);
    let updater = api.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        updater.put("agent/check/fail/c", "").await;
        updater.put("agent/check/pass/c", "").await
    });
    let started = Instant::now();
    let r = patient(&api)
        .get(&format!(
            "health/service/idgen?passing&index={index}&wait=30s"
        ))
        .await;
    let took = started.elapsed();
    assert!(r.index > index, "did not wake on the change: {took:?}");
}
