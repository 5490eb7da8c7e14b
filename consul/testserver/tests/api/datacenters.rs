//! Several datacenters in one emulator: each its own KV, sessions, catalog
//! and raft index, reached with `?dc=`, as Consul's WAN federation forwards
//! a request to the named datacenter's servers (`forwardDC` in
//! `agent/consul/rpc.go`).

use serde_json::{json, Value};

use crate::support::{b64, start, Api};

/// Two datacenters: `dc1` (the first, primary) and `dc2`, each with the
/// API of its `agent-0`.
async fn two() -> (
    consul_testserver::TestConsul,
    Api,
    consul_testserver::TestConsul,
    Api,
) {
    let (dc1, api1) = start().await;
    let dc2 = dc1
        .add_datacenter("dc2")
        .await
        .unwrap_or_else(|e| panic!("add dc2: {e}"));
    let api2 = Api::new(dc2.addr());
    (dc1, api1, dc2, api2)
}

#[tokio::test]
async fn each_datacenter_has_its_own_kv_and_dc_routes_to_it() {
    let (dc1, api1, dc2, api2) = two().await;
    assert_eq!(api1.put("kv/k", "one").await.text, "true");
    assert_eq!(api2.get("kv/k").await.status, 404, "dc2 has its own KV");
    // A write with ?dc= lands in that datacenter's state, not the local one.
    assert_eq!(api2.put("kv/k?dc=dc1&cas=0", "two").await.text, "false");
    assert_eq!(api2.put("kv/w?dc=dc1", "from-dc2").await.text, "true");
    assert!(dc2.kv_get("w").is_none());
    assert_eq!(dc1.kv_get("w").map(|e| e.value), Some(b"from-dc2".to_vec()));
    assert_eq!(
        api2.get("kv/w?dc=dc1&raw&consistent").await.text,
        "from-dc2"
    );
    // A txn with ?dc= too, and the index headers are that datacenter's.
    let txn = json!([{"KV": {"Verb": "cas", "Key": "t", "Value": b64("x"), "Index": 0}}]);
    assert_eq!(api1.put_json("txn?dc=dc2", txn).await.status, 200);
    assert!(dc2.kv_get("t").is_some() && dc1.kv_get("t").is_none());
    assert_eq!(api1.get("kv/t?dc=dc2").await.index, dc2.index());
    assert_ne!(dc1.index(), dc2.index(), "one raft index per datacenter");
    dc2.shutdown().await;
    dc1.shutdown().await;
}

#[tokio::test]
async fn agents_report_their_datacenter_and_the_primary() {
    let (dc1, api1, dc2, api2) = two().await;
    for (api, dc) in [(&api1, "dc1"), (&api2, "dc2")] {
        let me = api.get("agent/self").await.json();
        assert_eq!(me["Config"]["Datacenter"], dc);
        assert_eq!(me["Config"]["PrimaryDatacenter"], "dc1");
        assert_eq!(me["Member"]["Tags"]["dc"], dc);
    }
    let list = |r: crate::support::Resp| -> Value { r.json() };
    assert_eq!(
        list(api1.get("catalog/datacenters").await),
        json!(["dc1", "dc2"])
    );
    assert_eq!(
        list(api2.get("catalog/datacenters").await),
        json!(["dc2", "dc1"]),
        "the local datacenter first"
    );
    let again = dc1.add_datacenter("dc2").await;
    assert!(again.is_err(), "a running datacenter's name is taken");
    dc2.shutdown().await;
    dc1.shutdown().await;
}

#[tokio::test]
async fn sessions_and_services_are_per_datacenter() {
    let (dc1, api1, dc2, api2) = two().await;
    // A node of dc2 only is not in dc1's catalog: a session for it there
    // is refused, as a remote server refuses an unknown node.
    let only = dc2
        .add_agent("dc2-only")
        .await
        .unwrap_or_else(|e| panic!("add agent: {e}"));
    let r = Api::new(only)
        .put_json("session/create?dc=dc1", json!({}))
        .await;
    assert_eq!(r.status, 500, "{}", r.text);
    assert!(r.text.contains("Missing node registration"), "{}", r.text);
    let sid = api1.session(json!({"TTL": "10s"})).await;
    assert_eq!(api2.get(&format!("session/info/{sid}")).await.text, "[]");
    let info = api2.get(&format!("session/info/{sid}?dc=dc1")).await.json();
    assert_eq!(info[0]["ID"], sid.as_str());
    // A lock taken through dc2's agent lives in dc1.
    let r = api2.put(&format!("kv/l?dc=dc1&acquire={sid}"), "v").await;
    assert_eq!(r.text, "true");
    assert_eq!(dc1.kv_get("l").and_then(|e| e.session), Some(sid.clone()));
    // Services register with the local agent, and health reads ?dc=.
    let svc = json!({"ID": "idgen-1", "Name": "idgen", "Port": 1,
                     "Check": {"TTL": "30s", "Status": "passing"}});
    assert_eq!(
        api2.put_json("agent/service/register", svc).await.status,
        200
    );
    assert_eq!(api1.get("health/service/idgen").await.json(), json!([]));
    let remote = api1.get("health/service/idgen?dc=dc2&passing").await.json();
    assert_eq!(remote[0]["Service"]["ID"], "idgen-1");
    dc2.shutdown().await;
    dc1.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_datacenter_answers_500_and_applies_nothing() {
    let (dc1, api1, dc2, api2) = two().await;
    let unreachable = "Remote DC has no server currently reachable";
    dc1.faults().wan_partition(true);
    for (api, path) in [(&api2, "kv/p?dc=dc1"), (&api1, "kv/p?dc=dc2")] {
        let r = api.put(path, "v").await;
        assert_eq!((r.status, r.text.as_str()), (500, unreachable), "{path}");
    }
    assert!(dc1.kv_get("p").is_none() && dc2.kv_get("p").is_none());
    // Each side still serves its own datacenter, and still lists the other.
    assert_eq!(api1.put("kv/p", "local").await.text, "true");
    assert_eq!(
        api2.get("catalog/datacenters").await.json(),
        json!(["dc2", "dc1"])
    );
    dc1.faults().wan_partition(false);
    assert_eq!(api2.get("kv/p?dc=dc1&raw").await.text, "local");
    // Down: its own agents refuse too; back: everything is as it was.
    dc1.faults().datacenter_down(true);
    assert_eq!(api2.get("kv/p?dc=dc1").await.text, unreachable);
    assert!(api1
        .try_send(reqwest::Method::GET, "kv/p", vec![])
        .await
        .is_err());
    dc1.faults().datacenter_down(false);
    assert_eq!(api1.get("kv/p?raw").await.text, "local");
    // The control API heals a partition through any agent.
    dc1.faults().wan_partition(true);
    let url = format!(
        "http://{}/_testserver/wan-partition?dc=dc1&on=false",
        dc2.addr()
    );
    let r = api2
        .http
        .put(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("control: {e}"));
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(api2.get("kv/p?dc=dc1&raw").await.text, "local");
    // A datacenter whose handles are gone is known but unreachable.
    dc2.shutdown().await;
    assert_eq!(api1.get("kv/p?dc=dc2").await.text, unreachable);
    assert_eq!(api1.get("kv/p?dc=dc3").await.text, "No path to datacenter");
    dc1.shutdown().await;
}

#[tokio::test]
async fn tokens_work_in_every_datacenter() {
    let config = consul_testserver::Config {
        acl_master_token: Some("root".to_owned()),
        ..crate::support::fast_config()
    };
    let (dc1, api1) = crate::support::start_with(config).await;
    let dc2 = dc1
        .add_datacenter("dc2")
        .await
        .unwrap_or_else(|e| panic!("add dc2: {e}"));
    dc1.add_token(
        "writer",
        consul_testserver::Policy {
            key_prefix_write: vec!["idgen/".to_owned()],
            ..Default::default()
        },
    );
    let api2 = Api::new(dc2.addr()).with_token("writer");
    assert_eq!(api2.put("kv/idgen/a", "v").await.text, "true");
    assert_eq!(api2.put("kv/other", "v").await.status, 403);
    assert_eq!(
        api1.with_token("writer")
            .put("kv/idgen/a?dc=dc2&cas=0", "w")
            .await
            .text,
        "false"
    );
    assert_eq!(api1.get("kv/idgen/a?dc=dc2").await.status, 403, "no token");
    dc2.shutdown().await;
    dc1.shutdown().await;
}
