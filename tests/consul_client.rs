//! The Consul client against the in-repo Consul-compatible test server:
//! every call idgen relies on, its error mapping, and the retry rules
//! (idempotent calls are retried, writes whose outcome matters never are).

use std::time::Duration;

use consul_testserver::{Config, TestConsul};
use idgen::consul::{
    Consistency, ConsulClient, ConsulConfig, ConsulError, KvWrite, ServiceCheck,
    ServiceRegistration, SessionBehavior, SessionSpec, TxnOp, TxnOutcome,
};

fn client_for(addr: std::net::SocketAddr, token: Option<&str>) -> ConsulClient {
    ConsulClient::new(ConsulConfig {
        address: format!("http://{addr}"),
        acl_token: token.map(str::to_owned),
        timeout: Duration::from_millis(800),
        retries: 2,
        backoff: Duration::from_millis(10),
        tls: None,
    })
    .expect("client")
}

fn session(name: &str, lock_delay: Duration) -> SessionSpec {
    SessionSpec {
        name: name.into(),
        ttl: Duration::from_secs(10),
        behavior: SessionBehavior::Release,
        lock_delay,
        node_checks: None,
        service_checks: vec![],
    }
}

#[tokio::test]
async fn kv_cas_list_and_delete() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = client_for(consul.addr(), None);
    let key = "idgen/test/workers/0/1";
    assert!(
        c.kv_put(key, b"a", KvWrite::Cas(0)).await.unwrap(),
        "create-only on a missing key"
    );
    assert!(
        !c.kv_put(key, b"b", KvWrite::Cas(0)).await.unwrap(),
        "create-only refuses an existing key"
    );
    let (entry, index) = c.kv_get(key, Consistency::Consistent).await.unwrap();
    let entry = entry.expect("present");
    assert_eq!(entry.value, b"a");
    assert!(index >= entry.modify_index);
    assert!(!c
        .kv_put(key, b"c", KvWrite::Cas(entry.modify_index + 1000))
        .await
        .unwrap());
    assert!(c
        .kv_put(key, b"c", KvWrite::Cas(entry.modify_index))
        .await
        .unwrap());
    let (entry, _) = c.kv_get(key, Consistency::Default).await.unwrap();
    assert_eq!(entry.unwrap().value, b"c");
    c.kv_put("idgen/test/workers/0/2", b"", KvWrite::Set)
        .await
        .unwrap();
    let list = c
        .kv_list("idgen/test/workers/", Consistency::Consistent)
        .await
        .unwrap();
    let keys: Vec<_> = list.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["idgen/test/workers/0/1", "idgen/test/workers/0/2"]);
    assert_eq!(list[1].value, b"", "null value decodes as empty");
    assert!(c
        .kv_list("idgen/none/", Consistency::Default)
        .await
        .unwrap()
        .is_empty());
    assert!(c.kv_delete(key, None).await.unwrap());
    assert_eq!(
        c.kv_get(key, Consistency::Consistent).await.unwrap().0,
        None
    );
    consul.shutdown().await;
}

#[tokio::test]
async fn sessions_and_locks() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = client_for(consul.addr(), None);
    let a = c
        .session_create(&session("a", Duration::ZERO))
        .await
        .unwrap();
    let b = c
        .session_create(&session("b", Duration::ZERO))
        .await
        .unwrap();
    assert_ne!(a, b);
    let key = "idgen/test/workers/0/0";
    assert!(c
        .kv_put(key, b"owner-a", KvWrite::Acquire(&a))
        .await
        .unwrap());
    assert!(
        !c.kv_put(key, b"owner-b", KvWrite::Acquire(&b))
            .await
            .unwrap(),
        "held by a"
    );
    let (entry, _) = c.kv_get(key, Consistency::Consistent).await.unwrap();
    let entry = entry.unwrap();
    assert_eq!(entry.session.as_deref(), Some(a.as_str()));
    assert_eq!(entry.lock_index, 1);
    assert_eq!(entry.value, b"owner-a");
    assert!(
        !c.kv_put(key, b"x", KvWrite::Release(&b)).await.unwrap(),
        "only the holder releases"
    );
    assert!(c
        .kv_put(key, b"owner-a", KvWrite::Release(&a))
        .await
        .unwrap());
    assert!(c
        .kv_put(key, b"owner-b", KvWrite::Acquire(&b))
        .await
        .unwrap());
    let info = c.session_renew(&a).await.unwrap().expect("session a alive");
    assert_eq!(info.id, a);
    assert!(info.ttl.unwrap() >= Duration::from_secs(10));
    assert!(c.session_info(&b).await.unwrap().is_some());
    c.session_destroy(&a).await.unwrap();
    c.session_destroy(&a).await.unwrap(); // idempotent
    assert_eq!(
        c.session_renew(&a).await.unwrap(),
        None,
        "a destroyed session is gone"
    );
    assert_eq!(c.session_info(&a).await.unwrap(), None);
    consul.shutdown().await;
}

#[tokio::test]
async fn txn_commits_with_new_indexes_or_rolls_back_whole() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = client_for(consul.addr(), None);
    let s = c
        .session_create(&session("s", Duration::ZERO))
        .await
        .unwrap();
    let lock = "idgen/test/workers/0/3";
    let hwm = "idgen/test/hwm/0/3";
    assert!(c.kv_put(lock, b"me", KvWrite::Acquire(&s)).await.unwrap());
    let ops = [
        TxnOp::CheckSession {
            key: lock.into(),
            session: s.clone(),
        },
        TxnOp::Cas {
            key: hwm.into(),
            value: b"1000".to_vec(),
            index: 0,
        },
    ];
    let TxnOutcome::Committed(results) = c.txn(&ops).await.unwrap() else {
        panic!("txn should commit");
    };
    let written = results.iter().find(|e| e.key == hwm).expect("cas result");
    assert!(written.modify_index > 0);
    // The same cas again: index 0 no longer matches, nothing applies.
    let rolled = c
        .txn(&[
            TxnOp::Set {
                key: "idgen/test/other".into(),
                value: b"x".to_vec(),
            },
            TxnOp::Cas {
                key: hwm.into(),
                value: b"2000".to_vec(),
                index: 0,
            },
        ])
        .await
        .unwrap();
    let TxnOutcome::RolledBack(errors) = rolled else {
        panic!("txn should roll back");
    };
    assert_eq!(errors[0].op_index, 1);
    assert_eq!(
        c.kv_get("idgen/test/other", Consistency::Consistent)
            .await
            .unwrap()
            .0,
        None,
        "all or nothing"
    );
    // Chaining on the returned index saves a re-read.
    let ok = c
        .txn(&[TxnOp::Cas {
            key: hwm.into(),
            value: b"3000".to_vec(),
            index: written.modify_index,
        }])
        .await
        .unwrap();
    assert!(matches!(ok, TxnOutcome::Committed(_)));
    let too_many: Vec<TxnOp> = (0..65)
        .map(|i| TxnOp::Get {
            key: format!("k{i}"),
        })
        .collect();
    assert!(matches!(
        c.txn(&too_many).await,
        Err(ConsulError::Decode { .. })
    ));
    consul.shutdown().await;
}

#[tokio::test]
async fn agent_registration_checks_and_health() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = client_for(consul.addr(), None);
    let reg = ServiceRegistration {
        id: "idgen-a".into(),
        name: "idgen".into(),
        tags: vec!["dc0".into(), "worker-1".into()],
        address: String::new(),
        port: 50051,
        meta: [("worker".to_owned(), "1".to_owned())].into(),
        checks: vec![ServiceCheck::Ttl {
            check_id: "idgen-a-ttl".into(),
            ttl: Duration::from_secs(30),
            passing: true,
            deregister_after: Some(Duration::from_secs(60)),
        }],
    };
    c.service_register(&reg).await.unwrap();
    let healthy = c.health_service("idgen", true).await.unwrap();
    assert_eq!(healthy.len(), 1);
    assert_eq!(healthy[0].id, "idgen-a");
    assert_eq!(healthy[0].port, 50051);
    assert_eq!(
        healthy[0].address, "127.0.0.1",
        "empty service address falls back to the node's"
    );
    assert_eq!(healthy[0].meta.get("worker").map(String::as_str), Some("1"));
    c.check_update("idgen-a-ttl", "critical", "testing")
        .await
        .unwrap();
    assert!(c.health_service("idgen", true).await.unwrap().is_empty());
    assert_eq!(c.health_service("idgen", false).await.unwrap().len(), 1);
    c.check_update("idgen-a-ttl", "passing", "").await.unwrap();
    assert_eq!(c.health_service("idgen", true).await.unwrap().len(), 1);
    let err = c
        .check_update("no-such-check", "passing", "")
        .await
        .unwrap_err();
    assert!(matches!(err, ConsulError::UnknownCheck { .. }), "{err}");
    c.service_deregister("idgen-a").await.unwrap();
    assert!(c.health_service("idgen", false).await.unwrap().is_empty());
    consul.shutdown().await;
}

#[tokio::test]
async fn blocking_read_returns_on_change() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = client_for(consul.addr(), None);
    let key = "idgen/test/watch";
    c.kv_put(key, b"1", KvWrite::Set).await.unwrap();
    let (_, index) = c.kv_get(key, Consistency::Default).await.unwrap();
    let watcher = {
        let c = c.clone();
        tokio::spawn(async move {
            c.kv_get_blocking(
                key,
                Consistency::Default,
                Some((index, Duration::from_secs(5))),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!watcher.is_finished(), "blocks until something changes");
    c.kv_put(key, b"2", KvWrite::Set).await.unwrap();
    let (entry, new_index) = tokio::time::timeout(Duration::from_secs(3), watcher)
        .await
        .expect("woke up on the change")
        .unwrap()
        .unwrap();
    assert_eq!(entry.unwrap().value, b"2");
    assert!(new_index > index);
    consul.shutdown().await;
}

/// A blocking list of a folder wakes on a write inside it, not on writes
/// elsewhere (the folder's index is its keys' highest ModifyIndex).
#[tokio::test]
async fn blocking_list_returns_on_a_change_inside_its_folder() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = client_for(consul.addr(), None);
    let dir = "idgen/test/defs/";
    c.kv_put(&format!("{dir}a"), b"1", KvWrite::Set)
        .await
        .unwrap();
    let (entries, index) = c
        .kv_list_blocking(dir, Consistency::Default, None)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    let watcher = {
        let c = c.clone();
        tokio::spawn(async move {
            c.kv_list_blocking(
                dir,
                Consistency::Default,
                Some((index, Duration::from_secs(10))),
            )
            .await
        })
    };
    c.kv_put("idgen/test/elsewhere", b"x", KvWrite::Set)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!watcher.is_finished(), "a write elsewhere does not wake it");
    c.kv_put(&format!("{dir}b"), b"2", KvWrite::Set)
        .await
        .unwrap();
    let (entries, new_index) = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("woke up on the change")
        .unwrap()
        .unwrap();
    let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, [format!("{dir}a"), format!("{dir}b")]);
    assert!(new_index > index);
    consul.shutdown().await;
}

#[tokio::test]
async fn acl_denials_and_bad_addresses_are_clear_errors() {
    let consul = TestConsul::start(Config {
        acl_master_token: Some("root-secret".into()),
        ..Config::default()
    })
    .await
    .unwrap();
    let good = client_for(consul.addr(), Some("root-secret"));
    assert!(good
        .kv_put("idgen/test/k", b"v", KvWrite::Set)
        .await
        .unwrap());
    let bad = client_for(consul.addr(), Some("wrong-secret"));
    let err = bad
        .kv_get("idgen/test/k", Consistency::Default)
        .await
        .unwrap_err();
    assert!(matches!(err, ConsulError::PermissionDenied { .. }), "{err}");
    assert!(
        !err.to_string().contains("wrong-secret"),
        "the token never appears in errors"
    );
    assert!(
        !format!("{bad:?}").contains("wrong-secret"),
        "nor in Debug output"
    );
    let none = client_for(consul.addr(), None);
    assert!(matches!(
        none.kv_put("idgen/test/k", b"v", KvWrite::Set).await,
        Err(ConsulError::PermissionDenied { .. })
    ));
    consul.shutdown().await;

    for address in ["127.0.0.1:8500", "ftp://x", "http//nohost", ""] {
        let err = ConsulClient::new(ConsulConfig {
            address: address.into(),
            ..ConsulConfig::default()
        })
        .unwrap_err();
        assert!(
            matches!(err, ConsulError::BadAddress(_)),
            "{address}: {err}"
        );
    }
    // Nothing listens on port 1 of loopback.
    let gone = ConsulClient::new(ConsulConfig {
        address: "http://127.0.0.1:1".into(),
        retries: 0,
        ..ConsulConfig::default()
    })
    .unwrap();
    let err = gone.kv_get("k", Consistency::Default).await.unwrap_err();
    assert!(
        matches!(
            err,
            ConsulError::Unreachable {
                maybe_sent: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.outcome_unknown(), "a refused connection sent nothing");
}

#[tokio::test]
async fn retries_idempotent_calls_but_never_writes_whose_outcome_matters() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = client_for(consul.addr(), None);
    c.kv_put("idgen/test/r", b"1", KvWrite::Set).await.unwrap();
    let faults = consul.faults();
    faults.no_leader("agent-0", true);
    let reads_before = consul.request_count(Some("agent-0"), "kv");
    let err = c
        .kv_get("idgen/test/r", Consistency::Consistent)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ConsulError::Status { status: 500, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("No cluster leader"), "{err}");
    let reads = consul.request_count(Some("agent-0"), "kv") - reads_before;
    assert_eq!(reads, 3, "a read is tried once plus twice more");
    let before = consul.request_count(Some("agent-0"), "kv");
    let err = c
        .kv_put("idgen/test/r", b"2", KvWrite::Cas(1))
        .await
        .unwrap_err();
    assert!(err.outcome_unknown(), "a 5xx write may have been applied");
    assert_eq!(
        consul.request_count(Some("agent-0"), "kv") - before,
        1,
        "a cas is sent once"
    );
    faults.no_leader("agent-0", false);

    // A request that gets no answer times out and may have been applied.
    faults.drop_requests("agent-0", true);
    let err = c
        .kv_put("idgen/test/r", b"3", KvWrite::Cas(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConsulError::Unreachable {
                maybe_sent: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.outcome_unknown());
    faults.drop_requests("agent-0", false);
    assert!(
        c.kv_get("idgen/test/r", Consistency::Default).await.is_ok(),
        "healthy again"
    );
    consul.shutdown().await;
}
