//! Fault injection and request counters.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{client, eventually, fast_config, start, start_with, Api};

#[tokio::test]
async fn refuse_closes_the_port_and_reopens_it() {
    let (consul, api) = start().await;
    assert_eq!(
        api.get("kv/x").await.status,
        404,
        "pooled connection is open"
    );
    consul.faults().refuse("agent-0", true);
    // Refused, not left hanging: the error is the connection's, not the
    // client's 5 s timeout.
    let err = api.try_send(reqwest::Method::GET, "kv/x", vec![]).await;
    assert!(
        err.as_ref().is_err_and(|e| !e.is_timeout()),
        "request must fail at once while refused: {err:?}"
    );
    let fresh = Api::new(consul.addr());
    let err = fresh.try_send(reqwest::Method::GET, "kv/x", vec![]).await;
    assert!(err.as_ref().is_err_and(|e| e.is_connect()), "{err:?}");

    consul.faults().refuse("agent-0", false);
    assert_eq!(
        fresh.get("kv/x").await.status,
        404,
        "same address serves again"
    );
    assert_eq!(api.put("kv/x", "v").await.text, "true");
}

#[tokio::test]
async fn delay_slows_answers_but_applies_writes() {
    let (consul, api) = start().await;
    consul
        .faults()
        .delay("agent-0", Some(Duration::from_millis(400)));
    let started = Instant::now();
    assert_eq!(api.put("kv/slow", "1").await.text, "true");
    assert!(started.elapsed() >= Duration::from_millis(400));

    let impatient = Api {
        http: client(Duration::from_millis(100)),
        ..api.clone()
    };
    let r = impatient
        .try_send(reqwest::Method::PUT, "kv/slow", b"2".to_vec())
        .await;
    assert!(r.is_err_and(|e| e.is_timeout()));
    assert_eq!(
        consul.kv_get("slow").map(|e| e.value),
        Some(b"2".to_vec()),
        "applied anyway"
    );

    // A delay far past the client's 5 s timeout, then none: the answer
    // comes (a delay left in place would time the request out).
    consul
        .faults()
        .delay("agent-0", Some(Duration::from_secs(3600)));
    consul.faults().delay("agent-0", None);
    let r = api.try_send(reqwest::Method::GET, "kv/slow", vec![]).await;
    assert!(r.is_ok_and(|r| r.status == 200), "the delay was not lifted");
}

#[tokio::test]
async fn no_leader_answers_500_without_applying() {
    let (consul, api) = start().await;
    let addr1 = consul
        .add_agent("agent-1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    consul.faults().no_leader("agent-0", true);
    let r = api.put("kv/n", "v").await;
    assert_eq!((r.status, r.text.as_str()), (500, "No cluster leader"));
    assert_eq!(r.index, 0, "no X-Consul-Index on an error");
    assert!(consul.kv_get("n").is_none());
    assert_eq!(
        Api::new(addr1).put("kv/n", "v").await.text,
        "true",
        "other agents unaffected"
    );
    consul.faults().no_leader("agent-0", false);
    assert_eq!(api.get("kv/n?raw").await.text, "v");
}

#[tokio::test]
async fn dropped_requests_hang_until_the_client_times_out() {
    let (consul, api) = start().await;
    consul.faults().drop_requests("agent-0", true);
    let impatient = Api {
        http: client(Duration::from_millis(300)),
        ..api.clone()
    };
    let started = Instant::now();
    let r = impatient
        .try_send(reqwest::Method::PUT, "kv/d", b"v".to_vec())
        .await;
    assert!(r.is_err_and(|e| e.is_timeout()));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        consul.kv_get("d").is_none(),
        "a dropped request is not applied"
    );
    consul.faults().drop_requests("agent-0", false);
    assert_eq!(api.put("kv/d", "v").await.text, "true");
}

#[tokio::test]
async fn paused_expiry_keeps_sessions_until_resumed() {
    let config = consul_testserver::Config {
        ttl_expiry_factor: 1.0,
        ..fast_config()
    };
    let (consul, api) = start_with(config).await;
    consul.faults().pause_session_expiry(true);
    let id = api.session(json!({"TTL": "200ms"})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(consul.sessions().len(), 1, "no expiry while paused");
    assert_eq!(
        api.put(&format!("session/renew/{id}"), "").await.status,
        200
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(consul.sessions().len(), 1);
    consul.faults().pause_session_expiry(false);
    let c = consul.clone();
    eventually(Duration::from_secs(1), "expiry after resume", || {
        let c = c.clone();
        async move { c.sessions().is_empty() }
    })
    .await;
}

/// A leader election restarts every session timer at 2 x TTL from the
/// election (even with `ttl_expiry_factor` 1.0) and forgets lock-delays.
#[tokio::test]
async fn an_election_restarts_session_timers_at_twice_the_ttl() {
    let config = consul_testserver::Config {
        ttl_expiry_factor: 1.0,
        ..fast_config()
    };
    let (consul, api) = start_with(config).await;
    let id = api
        .session(json!({"TTL": "300ms", "LockDelay": "0s"}))
        .await;
    let held = api.session(json!({"LockDelay": "60s"})).await;
    let other = api.session(json!({})).await;
    assert_eq!(
        api.put(&format!("kv/e?acquire={id}"), "v").await.text,
        "true"
    );
    assert_eq!(
        api.put(&format!("kv/d?acquire={held}"), "v").await.text,
        "true"
    );
    api.put(&format!("session/destroy/{held}"), "").await;
    assert_eq!(
        api.put(&format!("kv/d?acquire={other}"), "x").await.text,
        "false",
        "inside its 60 s lock-delay"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let index = consul.index();
    assert_eq!(
        consul.faults().leader_election(),
        1,
        "one session has a TTL"
    );
    let elected = Instant::now();
    assert_eq!(consul.index(), index, "an election is not a write");
    assert_eq!(
        api.put(&format!("kv/d?acquire={other}"), "x").await.text,
        "true",
        "the new leader has no lock-delays"
    );
    // Without the election, the session would be gone 300 ms after its
    // creation (factor 1.0); now it lives until 600 ms after the election.
    tokio::time::sleep(Duration::from_millis(450)).await;
    if elected.elapsed() < Duration::from_millis(550) {
        assert!(
            consul.sessions().iter().any(|s| s.id == id),
            "still alive {:?} after the election",
            elected.elapsed()
        );
    }
    let c = consul.clone();
    eventually(Duration::from_secs(2), "expiry at 2 x TTL", || {
        let c = c.clone();
        let id = id.clone();
        async move { !c.sessions().iter().any(|s| s.id == id) }
    })
    .await;
    assert!(elected.elapsed() >= Duration::from_millis(600));
    assert_eq!(consul.kv_get("e").and_then(|e| e.session), None);
}

#[tokio::test]
async fn request_counters_by_agent_and_endpoint() {
    let (consul, api) = start().await;
    let addr1 = consul
        .add_agent("agent-1")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let api1 = Api::new(addr1);
    let id = api.session(json!({"TTL": "10s"})).await;
    for _ in 0..3 {
        api.put(&format!("session/renew/{id}"), "").await;
    }
    api1.put(&format!("session/renew/{id}"), "").await;
    api1.get("kv/a").await;
    consul.faults().no_leader("agent-1", true);
    api1.get("kv/a").await;
    assert_eq!(consul.request_count(Some("agent-0"), "session/renew"), 3);
    assert_eq!(consul.request_count(Some("agent-1"), "session/renew"), 1);
    assert_eq!(consul.request_count(None, "session/renew"), 4);
    assert_eq!(
        consul.request_count(Some("agent-1"), "kv"),
        2,
        "fault answers count"
    );
    assert_eq!(consul.request_count(Some("agent-0"), "session/create"), 1);
    assert_eq!(consul.request_count(Some("agent-0"), "*"), 4);
    assert_eq!(consul.request_count(None, "txn"), 0);
}

/// The binary's control API triggers the same election, outside `/v1`.
#[tokio::test]
async fn the_control_api_runs_an_election() {
    let config = consul_testserver::Config {
        acl_master_token: Some("root".to_owned()),
        ..fast_config()
    };
    let (consul, api) = start_with(config).await;
    let root = api.with_token("root");
    root.session(json!({"TTL": "10s"})).await;
    let url = format!("http://{}/_testserver/leader-election", consul.addr());
    let http = client(Duration::from_secs(5));
    let send = |method: reqwest::Method, token: Option<&str>| {
        let mut req = http.request(method, &url);
        if let Some(token) = token {
            req = req.header("X-Consul-Token", token);
        }
        async move {
            let resp = req.send().await.unwrap_or_else(|e| panic!("{e}"));
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap_or_default())
        }
    };
    assert_eq!(send(reqwest::Method::PUT, None).await.0, 403);
    let (status, text) = send(reqwest::Method::PUT, Some("root")).await;
    assert_eq!((status, text.as_str()), (200, r#"{"SessionsRestarted":1}"#));
    assert_eq!(send(reqwest::Method::GET, Some("root")).await.0, 405);
    let other = http
        .put(format!("http://{}/_testserver/nope", consul.addr()))
        .header("X-Consul-Token", "root")
        .send()
        .await
        .map(|r| r.status().as_u16());
    assert_eq!(other.ok(), Some(404));
    // Control calls are not Consul requests: only the session create counts.
    assert_eq!(consul.request_count(None, "*"), 1);
}
