//! Agent registration, TTL and gRPC checks, discovery, reaping, and
//! several agents sharing one cluster.

use std::time::Duration;

use consul_testserver::{HealthStatus, TestConsul};
use serde_json::{json, Value};
use tonic_health::ServingStatus;

use crate::support::{eventually, start, Api};

fn ttl_service(id: &str, ttl: &str) -> Value {
    json!({
        "ID": id, "Name": "idgen", "Tags": ["v1", "grpc"], "Address": "10.0.0.1",
        "Port": 50051, "Meta": {"worker": "3"},
        "Check": {"CheckID": format!("{id}:ttl"), "Name": "ttl", "TTL": ttl}
    })
}

async fn passing(api: &Api) -> Vec<Value> {
    let r = api.get("health/service/idgen?passing").await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json().as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn ttl_checks_drive_passing_filter() {
    let (consul, api) = start().await;
    assert_eq!(
        api.put_json("agent/service/register", ttl_service("idgen-1", "30s"))
            .await
            .status,
        200
    );
    assert!(
        passing(&api).await.is_empty(),
        "a new check without Status is critical"
    );
    let all = api.get("health/service/idgen").await.json();
    assert_eq!(all.as_array().map(Vec::len), Some(1));

    assert_eq!(
        api.put("agent/check/pass/idgen-1:ttl?note=ok", "")
            .await
            .status,
        200
    );
    let entries = passing(&api).await;
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(e["Node"]["Node"], "agent-0");
    assert_eq!(e["Node"]["Address"], "127.0.0.1");
    assert_eq!(e["Service"]["ID"], "idgen-1");
    assert_eq!(e["Service"]["Service"], "idgen");
    assert_eq!(e["Service"]["Port"], 50051);
    assert_eq!(e["Service"]["Address"], "10.0.0.1");
    assert_eq!(e["Service"]["Tags"], json!(["v1", "grpc"]));
    assert_eq!(e["Service"]["Meta"]["worker"], "3");
    let checks = e["Checks"].as_array().cloned().unwrap_or_default();
    assert!(checks.iter().any(|c| c["CheckID"] == "serfHealth"));
    assert!(checks
        .iter()
        .any(|c| c["CheckID"] == "idgen-1:ttl" && c["Output"] == "ok"));

    api.put("agent/check/warn/idgen-1:ttl", "").await;
    assert!(passing(&api).await.is_empty(), "warning is not passing");
    let update = json!({"Status": "passing", "Output": "fine"});
    assert_eq!(
        api.put_json("agent/check/update/idgen-1:ttl", update)
            .await
            .status,
        200
    );
    assert_eq!(passing(&api).await.len(), 1);
    api.put("agent/check/fail/idgen-1:ttl", "").await;
    assert!(passing(&api).await.is_empty());
    assert_eq!(consul.services()[0].status, HealthStatus::Critical);
    let bad = json!({"Status": "sideways"});
    assert_eq!(
        api.put_json("agent/check/update/idgen-1:ttl", bad)
            .await
            .status,
        400
    );

    let catalog = api.get("catalog/services").await.json();
    assert_eq!(catalog["idgen"], json!(["grpc", "v1"]));
    let services = api.get("agent/services").await.json();
    assert_eq!(services["idgen-1"]["Service"], "idgen");
    let checks = api.get("agent/checks").await.json();
    assert_eq!(checks["idgen-1:ttl"]["Status"], "critical");
    assert_eq!(
        api.get("health/service/idgen?tag=v1")
            .await
            .json()
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        api.get("health/service/idgen?tag=v9").await.json(),
        json!([])
    );

    assert_eq!(
        api.put("agent/service/deregister/idgen-1", "").await.status,
        200
    );
    assert!(consul.services().is_empty());
    assert_eq!(
        api.put("agent/service/deregister/idgen-1", "").await.status,
        404
    );
}

#[tokio::test]
async fn unknown_check_error_text() {
    let (_consul, api) = start().await;
    let r = api.put("agent/check/pass/x", "").await;
    assert_eq!(r.status, 500);
    assert_eq!(r.text, "CheckID \"x\" does not have associated TTL");
}

#[tokio::test]
async fn ttl_check_goes_critical_without_updates_and_service_is_reaped() {
    let (consul, api) = start().await;
    let body = json!({
        "Name": "idgen", "ID": "idgen-2",
        "Check": {"CheckID": "c", "TTL": "300ms", "Status": "passing",
                  "DeregisterCriticalServiceAfter": "400ms"}
    });
    assert_eq!(
        api.put_json("agent/service/register", body).await.status,
        200
    );
    assert_eq!(
        passing(&api).await.len(),
        1,
        "Status passing starts healthy"
    );
    let c = consul.clone();
    eventually(Duration::from_secs(2), "TTL expiry", || {
        let c = c.clone();
        async move {
            c.services()
                .first()
                .is_some_and(|s| s.status == HealthStatus::Critical)
        }
    })
    .await;
    assert_eq!(consul.services()[0].checks[0].output, "TTL expired");
    let c = consul.clone();
    eventually(Duration::from_secs(3), "reaping", || {
        let c = c.clone();
        async move { c.services().is_empty() }
    })
    .await;
}

/// A gRPC health server on loopback reporting `idgen.v1.IdGen` SERVING:
/// its reporter, address, stop sender and task.
async fn health_server() -> (
    tonic_health::server::HealthReporter,
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("idgen.v1.IdGen", ServingStatus::Serving)
        .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let grpc_addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    (reporter, grpc_addr, stop, server)
}

#[tokio::test]
async fn grpc_checks_probe_the_health_service() {
    let (reporter, grpc_addr, stop, server) = health_server().await;

    let (consul, api) = start().await;
    let body = json!({
        "Name": "idgen", "ID": "idgen-g",
        "Checks": [
            {"CheckID": "g", "GRPC": format!("{grpc_addr}/idgen.v1.IdGen"), "Interval": "100ms", "Timeout": "1s"},
            {"CheckID": "other", "GRPC": format!("{grpc_addr}/unknown.Service"), "Interval": "100ms"},
        ]
    });
    assert_eq!(
        api.put_json("agent/service/register", body).await.status,
        200
    );
    // An Interval under 1 s is raised to 1 s, as Consul does.
    let checks = api.get("agent/checks").await.json();
    assert_eq!(checks["g"]["Interval"], "1s", "{checks}");
    let status_of = |consul: TestConsul, id: &'static str| async move {
        consul
            .services()
            .first()
            .and_then(|s| s.checks.iter().find(|c| c.id == id).map(|c| c.status))
    };
    let c = consul.clone();
    eventually(Duration::from_secs(5), "SERVING -> passing", || {
        let c = c.clone();
        async move { status_of(c, "g").await == Some(HealthStatus::Passing) }
    })
    .await;
    assert_eq!(
        status_of(consul.clone(), "other").await,
        Some(HealthStatus::Critical)
    );

    reporter
        .set_service_status("idgen.v1.IdGen", ServingStatus::NotServing)
        .await;
    let c = consul.clone();
    eventually(Duration::from_secs(5), "NOT_SERVING -> critical", || {
        let c = c.clone();
        async move { status_of(c, "g").await == Some(HealthStatus::Critical) }
    })
    .await;
    let output = consul.services()[0]
        .checks
        .iter()
        .find(|c| c.id == "g")
        .map(|c| c.output.clone());
    assert!(output.unwrap_or_default().contains("NOT_SERVING"));

    let no_interval = json!({"Name": "x", "Check": {"GRPC": "127.0.0.1:1/x"}});
    assert_eq!(
        api.put_json("agent/service/register", no_interval)
            .await
            .status,
        400
    );
    let _ = stop.send(());
    let _ = server.await;
}

#[tokio::test]
async fn agents_are_nodes_sharing_one_cluster() {
    let (consul, api0) = start().await;
    let addr1 = consul
        .add_agent("agent-1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(consul.add_agent("agent-1").await.is_err());
    let api1 = Api::new(addr1);
    assert_eq!(
        api1.put_json("agent/service/register", ttl_service("idgen-b", "30s"))
            .await
            .status,
        200
    );
    api1.put("agent/check/pass/idgen-b:ttl", "").await;
    let r = api0.put("agent/check/pass/idgen-b:ttl", "").await;
    assert_eq!(r.status, 500, "checks are local to their agent");
    let entries = passing(&api0).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["Node"]["Node"], "agent-1");
    assert_eq!(consul.services()[0].node, "agent-1");
    api0.put("kv/shared", "yes").await;
    assert_eq!(api1.get("kv/shared?raw").await.text, "yes");
    let id = api1.session(json!({})).await;
    assert_eq!(
        api0.get(&format!("session/info/{id}")).await.json()[0]["Node"],
        "agent-1"
    );
}

#[tokio::test]
async fn agent_self_describes_the_agent() {
    let (consul, api0) = start().await;
    let r = api0.get("agent/self").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let me = r.json();
    assert_eq!(me["Config"]["Datacenter"], "dc1");
    assert_eq!(me["Config"]["NodeName"], "agent-0");
    assert!(me["Config"]["Version"]
        .as_str()
        .is_some_and(|v| !v.is_empty()));
    assert_eq!(me["Member"]["Name"], "agent-0");
    assert_eq!(me["Member"]["Tags"]["dc"], "dc1");
    let addr1 = consul
        .add_agent("agent-1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let other = Api::new(addr1).get("agent/self").await.json();
    assert_eq!(other["Config"]["NodeName"], "agent-1");
    assert_ne!(other["Config"]["NodeID"], me["Config"]["NodeID"]);
}

/// `?dc=` naming another datacenter: 500 `No path to datacenter`, on every
/// endpoint, nothing applied; the test cluster's own (`dc1`) works.
#[tokio::test]
async fn an_unknown_datacenter_has_no_path() {
    let (consul, api) = start().await;
    for (method, path) in [
        (reqwest::Method::GET, "kv/x?dc=dc2"),
        (reqwest::Method::PUT, "kv/x?dc=elsewhere"),
        (reqwest::Method::PUT, "session/create?dc=dc2"),
        (reqwest::Method::GET, "health/service/idgen?dc=dc2"),
        (reqwest::Method::PUT, "txn?dc=dc2"),
    ] {
        let r = api.send(method, path, b"[]".to_vec()).await;
        assert_eq!(
            (r.status, r.text.as_str()),
            (500, "No path to datacenter"),
            "{path}"
        );
    }
    assert!(consul.kv_get("x").is_none());
    assert!(consul.sessions().is_empty());
    assert_eq!(api.put("kv/x?dc=dc1", "v").await.text, "true");
    assert_eq!(api.get("kv/x?dc=dc1&raw").await.text, "v");
}

/// Consul staggers a new gRPC check's first probe by a random pause of up
/// to one interval: sixteen checks registered at once do not all pass
/// within 150 ms of a 1 s interval (all would, probing at once; the odds
/// of a false failure are 0.4^16 at worst), yet all pass soon after.
#[tokio::test]
async fn first_grpc_probes_are_staggered_over_one_interval() {
    let (_reporter, grpc_addr, stop, server) = health_server().await;
    let (consul, api) = start().await;
    let checks: Vec<Value> = (0..16)
        .map(|i| {
            json!({"CheckID": format!("g{i}"), "GRPC": format!("{grpc_addr}/idgen.v1.IdGen"),
                   "Interval": "1s"})
        })
        .collect();
    let registered = std::time::Instant::now();
    let r = api
        .put_json(
            "agent/service/register",
            json!({"Name": "idgen", "ID": "idgen-s", "Checks": checks}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let passing_now = |consul: &TestConsul| {
        consul.services()[0]
            .checks
            .iter()
            .filter(|c| c.status == HealthStatus::Passing)
            .count()
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let early = passing_now(&consul);
    if registered.elapsed() < Duration::from_millis(400) {
        assert!(early < 16, "all 16 first probes came within 150 ms");
    }
    let c = consul.clone();
    eventually(Duration::from_secs(5), "every check passing", || {
        let c = c.clone();
        async move { passing_now(&c) == 16 }
    })
    .await;
    let _ = stop.send(());
    let _ = server.await;
}
