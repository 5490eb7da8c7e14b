//! A real idgen node registered with the Consul test server: the agent's
//! gRPC health check sees it serving, sees it go away when it stops, and
//! the registration comes back when the agent forgets it; and a Consul
//! node's first start as docs/OPERATIONS.md gives it.

mod common;

use std::time::Duration;

use common::{metric, run_idgen, test_config, write_cluster_config, ChildServer, TestServer};
use consul_testserver::{Config, TestConsul};
use idgen::cluster::registration::{Registration, RegistrationSpec, SERVICE_NAME};
use idgen::consul::{ConsulClient, ConsulConfig};
use idgen::store::WorkerKey;

/// Polls `health/service/idgen?passing` until `want` instances pass
/// (bounded: 100 tries, 50 ms apart).
async fn wait_passing(client: &ConsulClient, want: usize) -> bool {
    for _ in 0..100 {
        if client
            .health_service(SERVICE_NAME, true)
            .await
            .map(|v| v.len() == want)
            .unwrap_or(false)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_node_is_discoverable_only_while_serving() {
    let consul = TestConsul::start(Config {
        min_deregister_critical_after: Duration::from_secs(60),
        ..Config::default()
    })
    .await
    .unwrap();
    let client = common::consul::default_client(&consul);
    let dir = tempfile::tempdir().unwrap();
    let node = TestServer::start(test_config(dir.path())).await;
    let reg = Registration::new(
        client.clone(),
        &RegistrationSpec {
            instance: "node-a".into(),
            service: SERVICE_NAME.into(),
            grpc: node.grpc,
            worker: WorkerKey {
                datacenter: 0,
                worker: 5,
            },
            modes: vec!["snowflake".into()],
            check_interval: Duration::from_millis(100),
            check_timeout: Duration::from_millis(500),
            deregister_after: Duration::from_secs(60),
            metrics_port: Some(node.http.port()),
            check_tls_server_name: None,
        },
    )
    .unwrap();
    reg.register().await.unwrap();
    assert!(
        wait_passing(&client, 1).await,
        "the agent's gRPC probe sees SERVING"
    );
    let entry = &client.health_service(SERVICE_NAME, true).await.unwrap()[0];
    assert_eq!(entry.id, "idgen-node-a");
    // Prometheus' consul_sd_configs reads the metrics port from Meta.
    let raw: serde_json::Value = reqwest::get(format!(
        "http://{}/v1/health/service/{SERVICE_NAME}?passing",
        consul.addr()
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        raw[0]["Service"]["Meta"]["metrics_port"],
        serde_json::Value::String(node.http.port().to_string()),
        "{raw}"
    );
    assert_eq!(entry.port, node.grpc.port());
    assert_eq!(entry.address, "127.0.0.1");
    assert!(
        entry.tags.contains(&"worker-5".to_owned()),
        "{:?}",
        entry.tags
    );
    assert_eq!(entry.meta.get("worker").map(String::as_str), Some("5"));

    // The agent forgets the service; keep_registered puts it back.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let keeper = {
        let reg = reg.clone();
        tokio::spawn(async move {
            reg.keep_registered(Duration::from_millis(100), async {
                let _ = stopped.await;
            })
            .await
        })
    };
    client.service_deregister("idgen-node-a").await.unwrap();
    let mut back = false;
    for _ in 0..100 {
        if reg.is_registered().await.unwrap() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(back, "re-registered after the agent lost it");
    assert!(wait_passing(&client, 1).await);
    let _ = stop.send(());
    keeper.await.unwrap();

    // A stopped node fails its check and drops out of discovery.
    node.stop().await;
    assert!(
        wait_passing(&client, 0).await,
        "a stopped node is not passing"
    );
    assert!(
        reg.is_registered().await.unwrap(),
        "still listed, as critical"
    );
    reg.deregister().await.unwrap();
    assert!(!reg.is_registered().await.unwrap());
    consul.shutdown().await;
}

#[test]
fn an_unspecified_address_is_refused() {
    let client = ConsulClient::new(ConsulConfig::default()).unwrap();
    let err = Registration::new(
        client,
        &RegistrationSpec {
            instance: "x".into(),
            service: SERVICE_NAME.into(),
            grpc: "0.0.0.0:50051".parse().unwrap(),
            worker: WorkerKey {
                datacenter: 0,
                worker: 0,
            },
            modes: vec![],
            check_interval: Duration::from_secs(5),
            check_timeout: Duration::from_secs(1),
            deregister_after: Duration::from_secs(60),
            metrics_port: None,
            check_tls_server_name: None,
        },
    )
    .unwrap_err();
    assert!(err.contains("advertise"), "{err}");
}

/// docs/OPERATIONS.md, "First start", a Consul cluster, as written there:
/// `idgen check-config --config prod.toml` passes, `idgen init` refuses a
/// Consul config (there is nothing to create), and `idgen serve --config
/// prod.toml` starts healthy: the log lines the page names, the node
/// passing in `GET /v1/health/service/idgen?passing`, `idgen_worker_id`
/// and `idgen_fenced` 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consul_nodes_first_start_is_checked_refuses_init_and_serves_registered() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_cluster_config(dir.path(), "n0", consul.addr(), &[]);
    let prod = dir.path().join("prod.toml");
    std::fs::rename(&config, &prod).unwrap();
    let cfg = prod.to_str().expect("a UTF-8 temp path");

    let (ok, out) = run_idgen(&["check-config", "--config", cfg]);
    assert!(ok && out.contains("backend = \"consul\""), "{out}");
    let (ok, out) = run_idgen(&["init", "--config", cfg]);
    assert!(!ok && out.contains("nothing to create"), "{out}");

    let node = ChildServer::start(&prod);
    for line in [
        "worker id claimed in Consul",
        "ready",
        "idgen serving",
        "registered in Consul with a gRPC health check",
    ] {
        assert!(
            node.logs_within_10s(line).await,
            "no {line:?}: {}",
            node.log_text()
        );
    }
    let client = common::consul::default_client(&consul);
    assert!(wait_passing(&client, 1).await, "the node passes its check");
    let text = common::metrics_text(&node).await;
    assert!(metric(&text, "idgen_worker_id").is_some(), "{text}");
    assert_eq!(metric(&text, "idgen_fenced"), Some(0.0), "{text}");
    assert_eq!(node.terminate().code(), Some(0));
}
