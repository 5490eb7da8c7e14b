//! Cluster mode end to end: real `idgen serve` processes against the
//! in-repo Consul-compatible test server (session TTL 2 s, expiry exactly
//! one TTL after the last renew, lock-delay 2 s).

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{
    check_with_promtool, default_layout, metric, run_idgen, wait_for_status, write_cluster_config,
    ChildServer,
};
use consul_testserver::{Config, HealthStatus, TestConsul};
use idgen::proto::{GenIdRequest, GenIdsRequest, Mode};

const LOCK_DELAY: Duration = Duration::from_secs(2);

async fn consul(acl: Option<&str>) -> TestConsul {
    common::consul::start(Config {
        acl_master_token: acl.map(str::to_owned),
        ..common::consul::cluster_settings()
    })
    .await
}

async fn one(node: &ChildServer) -> Result<u64, tonic::Status> {
    let mut c = node.client().await;
    c.gen_id(GenIdRequest {
        mode: Mode::Snowflake as i32,
        tag: String::new(),
    })
    .await
    .map(|r| r.into_inner().id)
}

fn worker_of(id: u64) -> u64 {
    default_layout().decompose(id).expect("decodes").worker
}

fn time_of(id: u64) -> u64 {
    default_layout().decompose(id).expect("decodes").unix_ms
}

fn hwm_in_kv(consul: &TestConsul, worker: u64) -> u64 {
    let e = consul
        .kv_get(&format!("idgen/test/hwm/0/{worker}"))
        .expect("a stored mark");
    String::from_utf8(e.value).unwrap().parse().unwrap()
}

/// Polls `cond` every 50 ms for up to `limit`.
async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

fn start(dir: &Path, name: &str, consul: std::net::SocketAddr) -> ChildServer {
    ChildServer::start(&write_cluster_config(dir, name, consul, &[]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_get_distinct_ids_register_healthy_and_clean_up_on_shutdown() {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agents = Vec::new();
    for i in 1..=3 {
        agents.push(consul.add_agent(&format!("agent-{i}")).await.unwrap());
    }
    let nodes: Vec<ChildServer> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| start(dir.path(), &format!("n{i}"), *a))
        .collect();
    let mut workers = HashSet::new();
    let mut all = HashSet::new();
    for n in &nodes {
        let got = common::snowflake_ids(n, 1000).await.expect("issues");
        let w: HashSet<u64> = got.iter().map(|id| worker_of(*id)).collect();
        assert_eq!(w.len(), 1, "one worker id per node");
        workers.extend(w);
        all.extend(got);
    }
    assert_eq!(workers.len(), 3, "three distinct worker ids: {workers:?}");
    assert_eq!(all.len(), 3000, "no duplicates across nodes");
    // Registered through each node's own agent, gRPC check passing.
    let healthy = eventually(Duration::from_secs(10), || {
        let s = consul.services();
        s.len() == 3
            && s.iter()
                .all(|s| s.name == "idgen" && s.status == HealthStatus::Passing)
    })
    .await;
    assert!(healthy, "three passing services: {:?}", consul.services());
    let ids_registered: HashSet<String> = consul.services().into_iter().map(|s| s.id).collect();
    assert_eq!(
        ids_registered,
        ["idgen-n0", "idgen-n1", "idgen-n2"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    for s in consul.services() {
        let worker = s.meta.get("worker").expect("worker in meta");
        assert!(s.tags.contains(&format!("worker-{worker}")), "{:?}", s.tags);
    }
    assert_eq!(consul.sessions().len(), 3);

    // SIGTERM: final mark, release, destroy, deregister.
    let mut highest = HashSet::new();
    for n in nodes {
        let last = one(&n).await.unwrap();
        highest.insert((worker_of(last), time_of(last)));
        assert!(n.terminate().success());
    }
    assert!(consul.services().is_empty(), "{:?}", consul.services());
    assert!(consul.sessions().is_empty(), "sessions destroyed");
    for (worker, last_ms) in highest {
        let lock = consul
            .kv_get(&format!("idgen/test/workers/0/{worker}"))
            .unwrap();
        assert_eq!(lock.session, None, "worker {worker} released");
        assert!(
            hwm_in_kv(&consul, worker) >= last_ms,
            "final mark covers the last ID"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_gets_its_worker_id_back_at_once_and_continues_above() {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), "a", consul.addr());
    let b = start(dir.path(), "b", consul.addr());
    let before = common::snowflake_ids(&a, 2000).await.unwrap();
    let worker = worker_of(before[0]);
    assert_ne!(worker, worker_of(one(&b).await.unwrap()));
    assert!(a.terminate().success());
    // Right away, well inside the 2 s lock-delay a crash would leave.
    let started = Instant::now();
    let a = start(dir.path(), "a", consul.addr());
    let after = common::snowflake_ids(&a, 2000).await.unwrap();
    assert!(started.elapsed() < LOCK_DELAY, "{:?}", started.elapsed());
    assert_eq!(worker_of(after[0]), worker, "same worker id back");
    assert!(after[0] > *before.iter().max().unwrap(), "continues above");
    assert!(a.terminate().success());
    assert!(b.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_id_is_free_only_after_expiry_and_lock_delay_and_the_next_holder_starts_above_it(
) {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let dead = start(dir.path(), "dead", consul.addr());
    let issued = common::snowflake_ids(&dead, 4000).await.unwrap();
    let worker = worker_of(issued[0]);
    // Hold session expiry, so the test decides when the session dies.
    consul.faults().pause_session_expiry(true);
    dead.kill();
    let hwm = hwm_in_kv(&consul, worker);
    assert!(hwm >= time_of(*issued.iter().max().unwrap()));

    let successor = write_cluster_config(
        dir.path(),
        "successor",
        consul.addr(),
        &[
            ("consul", "worker", "\"static\""),
            ("node", "worker_id", &worker.to_string()),
        ],
    );
    // While the session lives, the id cannot be taken.
    let attempt = ChildServer::try_start(&successor, &[]);
    let log = attempt.err().expect("the id is still held");
    assert!(log.contains("held by another node"), "{log}");

    // Let it expire (its renewals stopped at the kill, long ago).
    consul.faults().pause_session_expiry(false);
    assert!(eventually(Duration::from_secs(5), || consul.sessions().is_empty()).await);
    let gone = Instant::now();
    // Inside lock-delay the id is still refused.
    // Started with the clock 5 s behind: only the dead node's stored mark
    // can lift its IDs above the dead node's.
    let behind = ["--test-clock-offset-ms", "-5000"];
    let mut attempt = ChildServer::try_start(&successor, &behind);
    match &attempt {
        // Possible only if this attempt claimed after lock-delay.
        Ok(_) => assert!(
            gone.elapsed() + Duration::from_millis(100) >= LOCK_DELAY,
            "claimed {:?} after expiry, inside lock-delay",
            gone.elapsed()
        ),
        Err(log) => assert!(log.contains("held by another node"), "{log}"),
    }
    let node = loop {
        match std::mem::replace(&mut attempt, Err(String::new()))
            .or_else(|_| ChildServer::try_start(&successor, &behind))
        {
            Ok(node) => break node,
            Err(log) => {
                assert!(log.contains("held by another node"), "{log}");
                assert!(gone.elapsed() < Duration::from_secs(10), "never freed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // 100 ms: the session list is polled every 50 ms.
    assert!(
        gone.elapsed() + Duration::from_millis(100) >= LOCK_DELAY,
        "claimed {:?} after expiry",
        gone.elapsed()
    );
    let next = common::snowflake_ids(&node, 1000).await.unwrap();
    assert_eq!(worker_of(next[0]), worker);
    assert!(
        time_of(next[0]) > hwm,
        "starts above the dead node's mark {hwm}"
    );
    let issued: HashSet<u64> = issued.into_iter().collect();
    assert!(next.iter().all(|id| !issued.contains(id)));
    assert!(node.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_node_stops_before_its_session_can_expire_and_resumes_after() {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = consul.add_agent("agent-p").await.unwrap();
    let node = start(dir.path(), "p", agent);
    let other = start(dir.path(), "q", consul.addr());
    let mut seen: HashSet<u64> = common::snowflake_ids(&node, 1000)
        .await
        .unwrap()
        .into_iter()
        .collect();
    seen.extend(common::snowflake_ids(&other, 1000).await.unwrap());
    let session = consul
        .sessions()
        .into_iter()
        .find(|s| s.node == "agent-p")
        .expect("session")
        .id;

    consul.faults().drop_requests("agent-p", true);
    let cut = Instant::now();
    let mut last_ok = cut;
    let fenced = loop {
        match one(&node).await {
            Ok(id) => {
                assert!(seen.insert(id), "duplicate {id}");
                last_ok = Instant::now();
            }
            Err(status) => break status,
        }
        assert!(
            cut.elapsed() < Duration::from_secs(5),
            "never stopped issuing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(fenced.code(), tonic::Code::Unavailable);
    assert!(
        fenced.message().contains("lost its worker lock"),
        "{fenced:?}"
    );
    // The server (expiring exactly one TTL after the last renew it got)
    // still holds the session: the node stopped first.
    assert!(
        consul.sessions().iter().any(|s| s.id == session),
        "session expired before the node stopped issuing (last ID {:?} after the cut)",
        last_ok - cut
    );
    // Readiness follows within one monitor tick.
    assert!(wait_for_status(&format!("http://{}/readyz", node.http), 503).await);
    // The other node is unaffected.
    seen.extend(common::snowflake_ids(&other, 100).await.unwrap());
    let metrics = |n: &ChildServer| {
        let url = format!("http://{}/metrics", n.http);
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let text = metrics(&node).await;
    assert_eq!(metric(&text, "idgen_fenced"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "idgen_fencings_total"), Some(1.0));
    assert_eq!(metric(&text, "idgen_worker_id"), Some(-1.0));

    consul.faults().drop_requests("agent-p", false);
    let healed = Instant::now();
    let resumed = loop {
        match common::snowflake_ids(&node, 1000).await {
            Ok(got) => break got,
            Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        }
        assert!(healed.elapsed() < Duration::from_secs(15), "never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for id in resumed {
        assert!(seen.insert(id), "duplicate {id} after resuming");
    }
    assert!(node.log_text().contains("claimed again"));
    let text = metrics(&node).await;
    assert_eq!(metric(&text, "idgen_fenced"), Some(0.0));
    assert!(metric(&text, "idgen_worker_id").unwrap() >= 0.0);
    assert!(metric(&text, "idgen_consul_session_renew_age_seconds").unwrap() < 2.0);
    // Every endpoint's series exists from the start at zero: sum them.
    let consul_errors: f64 = text
        .lines()
        .filter(|l| l.starts_with("idgen_consul_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(consul_errors > 0.0, "{text}");
    check_with_promtool(&text);
    assert!(node.terminate().success());
    assert!(other.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_partition_shorter_than_its_session_a_node_hands_its_id_back_and_gets_it_again() {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = consul.add_agent("agent-s").await.unwrap();
    let node = start(dir.path(), "s", agent);
    let before = common::snowflake_ids(&node, 1000).await.unwrap();
    let worker = worker_of(before[0]);
    let session = consul.sessions()[0].id.clone();
    // The session outlives the partition (as with a partition shorter than
    // the TTL): the lock is still held when the node comes back.
    consul.faults().pause_session_expiry(true);
    consul.faults().drop_requests("agent-s", true);
    let cut = Instant::now();
    while one(&node).await.is_ok() {
        assert!(cut.elapsed() < Duration::from_secs(5), "never fenced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    consul.faults().drop_requests("agent-s", false);
    let healed = Instant::now();
    let after = loop {
        if let Ok(got) = common::snowflake_ids(&node, 1000).await {
            break got;
        }
        assert!(healed.elapsed() < Duration::from_secs(10), "never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Handed back (session destroyed, lock released without lock-delay)
    // and claimed again: the same id, above everything issued before.
    assert_eq!(worker_of(after[0]), worker);
    assert!(after[0] > *before.iter().max().unwrap());
    assert!(consul.sessions().iter().all(|s| s.id != session));
    assert!(node.log_text().contains("handed back"));
    consul.faults().pause_session_expiry(false);
    assert!(node.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_behind_the_stored_mark_refuses_to_start_and_frees_the_id() {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_cluster_config(dir.path(), "c", consul.addr(), &[]);
    let node = ChildServer::start(&config);
    let worker = worker_of(one(&node).await.unwrap());
    assert!(node.terminate().success());

    // `static`: exactly this id or nothing (an `auto` node would move on to
    // the next free id instead; tests/cluster_claim.rs).
    let worker_id = worker.to_string();
    let fixed = write_cluster_config(
        dir.path(),
        "c",
        consul.addr(),
        &[
            ("consul", "worker", "\"static\""),
            ("node", "worker_id", &worker_id),
        ],
    );
    let err = ChildServer::try_start(&fixed, &["--test-clock-offset-ms", "-60000"])
        .err()
        .expect("refuses to start");
    assert!(err.contains("behind"), "{err}");
    assert!(err.contains("max_startup_skew"), "{err}");
    // It gave the id back: a correct clock starts at once with the same id
    // (the auto config again, same instance).
    let config = write_cluster_config(dir.path(), "c", consul.addr(), &[]);
    let node = ChildServer::start(&config);
    assert_eq!(worker_of(one(&node).await.unwrap()), worker);
    assert!(node.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cluster_config_fails_at_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |config: &Path| -> (bool, String) {
        run_idgen(&["serve", "--config", config.to_str().unwrap()])
    };
    // Nothing listens on this port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap();
    drop(closed);
    let (ok, out) = serve(&write_cluster_config(dir.path(), "u", closed_addr, &[]));
    assert!(!ok);
    assert!(out.contains("cannot reach Consul"), "{out}");

    let consul = consul(Some("root-secret")).await;
    let (ok, out) = serve(&write_cluster_config(
        dir.path(),
        "t",
        consul.addr(),
        &[("consul", "token", "\"wrong\"")],
    ));
    assert!(!ok);
    assert!(out.contains("403 permission denied"), "{out}");
    assert!(!out.contains("wrong"), "the token is never printed: {out}");

    std::fs::write(dir.path().join("token"), "root-secret\n").unwrap();
    let token_file = format!("\"{}\"", dir.path().join("token").display());
    let good = write_cluster_config(
        dir.path(),
        "g",
        consul.addr(),
        &[("consul", "token_file", &token_file)],
    );
    let node = ChildServer::start(&good);
    assert!(one(&node).await.is_ok(), "a right token from a file works");
    let log = std::sync::Arc::clone(&node.log);
    let status = node.terminate();
    assert!(
        status.success(),
        "{status:?} {}",
        log.lock().unwrap().join("\n")
    );

    for (key, value, expect) in [
        ("address", "\"http//127.0.0.1:8500\"", "consul.address"),
        ("address", "\"https://127.0.0.1:8500\"", "consul.address"),
        ("token_file", "\"/nonexistent/token\"", "consul.token_file"),
        ("worker", "\"any\"", "consul.worker"),
        ("lock_margin", "\"1s\"", "consul.lock_margin"),
    ] {
        let (ok, out) = serve(&write_cluster_config(
            dir.path(),
            "m",
            consul.addr(),
            &[("consul", key, value)],
        ));
        assert!(!ok, "{key} = {value} accepted");
        assert!(out.contains(expect), "{key} = {value}: {out}");
    }
    let (ok, out) = serve(&write_cluster_config(
        dir.path(),
        "z",
        consul.addr(),
        &[("node", "advertise", "\"0.0.0.0:50051\"")],
    ));
    assert!(!ok);
    assert!(out.contains("node.advertise"), "{out}");
    // Without the test-only override, Consul's 10 s minimum applies: a
    // shorter TTL is refused before anything reaches Consul.
    let (ok, out) = serve(&write_cluster_config(
        dir.path(),
        "y",
        consul.addr(),
        &[
            ("testing", "consul_session_ttl_min", "\"10s\""),
            ("consul", "session_ttl", "\"5s\""),
        ],
    ));
    assert!(!ok);
    assert!(out.contains("consul.session_ttl"), "{out}");
    assert!(out.contains("Consul's minimum session TTL"), "{out}");
    // A Consul whose session_ttl_min is above the TTL idgen asks for
    // (here the test server's default, 10 s, against the tests' 2 s)
    // answers 500 Invalid Session TTL: start-up fails and says so.
    let strict = TestConsul::start(Config::default()).await.unwrap();
    let (ok, out) = serve(&write_cluster_config(dir.path(), "x", strict.addr(), &[]));
    assert!(!ok);
    assert!(out.contains("Invalid Session TTL"), "{out}");
    strict.shutdown().await;
}

/// Requests one agent received, by endpoint.
fn traffic(consul: &TestConsul, agent: &str) -> Vec<(&'static str, u64)> {
    [
        "txn",
        "kv",
        "session/renew",
        "session/create",
        "agent/services",
        "health/service",
        "agent/service/register",
    ]
    .into_iter()
    .map(|e| (e, consul.request_count(Some(agent), e)))
    .collect()
}

fn delta(
    after: &[(&'static str, u64)],
    before: &[(&'static str, u64)],
) -> Vec<(&'static str, u64)> {
    after
        .iter()
        .zip(before)
        .map(|((e, a), (_, b))| (*e, a - b))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_consul_traffic_does_not_grow_with_the_request_rate() {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = consul.add_agent("agent-t").await.unwrap();
    // Production lease timings: TTL 15 s, lock-delay 15 s, margin 2 s.
    let config = write_cluster_config(
        dir.path(),
        "t",
        agent,
        &[
            ("consul", "session_ttl", "\"15s\""),
            ("consul", "lock_delay", "\"15s\""),
            ("consul", "lock_margin", "\"2s\""),
            ("consul", "timeout", "\"2s\""),
        ],
    );
    let node = ChildServer::start(&config);
    common::snowflake_ids(&node, 10).await.unwrap();
    // Registered with the modes it serves: no segment, lease or strict
    // section in its config.
    let mut tags = Vec::new();
    for _ in 0..100 {
        if let Some(s) = consul.services().first() {
            tags = s.tags.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let modes: Vec<&str> = tags
        .iter()
        .map(String::as_str)
        .filter(|t| !t.starts_with("dc-") && !t.starts_with("worker-"))
        .collect();
    assert_eq!(modes, ["snowflake", "formatted"], "{tags:?}");
    let window = Duration::from_secs(6);

    let t0 = traffic(&consul, "agent-t");
    let idle_from = Instant::now();
    tokio::time::sleep(window).await;
    let t1 = traffic(&consul, "agent-t");
    let idle_for = idle_from.elapsed();
    let idle = delta(&t1, &t0);

    let busy_from = Instant::now();
    let until = busy_from + window;
    let (mut issued, mut calls) = (0usize, 0u64);
    while Instant::now() < until {
        issued += common::snowflake_ids(&node, 1_000).await.unwrap().len();
        calls += 1;
    }
    let t2 = traffic(&consul, "agent-t");
    // The last batch ends after `until`: on a loaded machine the busy
    // window is longer than the idle one, and the timers (the cluster
    // index pulse alone is 20 lists a second) tick for longer.
    let busy_for = busy_from.elapsed();
    let busy = delta(&t2, &t1);
    let sum = |v: &[(&str, u64)]| v.iter().map(|(_, n)| n).sum::<u64>();
    let per_s = |v: &[(&str, u64)]| {
        v.iter()
            .filter(|(_, n)| *n > 0)
            .map(|(e, n)| format!("{e} {:.2}/s", *n as f64 / window.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!("Consul traffic of one node, idle: {}", per_s(&idle));
    eprintln!(
        "Consul traffic of one node, {issued} IDs issued: {}",
        per_s(&busy)
    );
    // Timers, not requests, drive the traffic: the idle rate over the
    // busy window's length, up to timer phase: one tick more per timer,
    // and a node runs seven that reach Consul (the cluster index pulse,
    // the mark renewal, its claim and layout reads, the status board, the
    // session renewal, the registration check; CI once saw +4 kv and +1
    // agent/services). A request per call would add at least one per
    // GenIds call, and the load makes at least 100.
    let phase = 7.0;
    assert!(
        calls >= 100 && calls as f64 > 10.0 * phase,
        "the load ran ({calls} calls, {issued} IDs)"
    );
    let expected = sum(&idle) as f64 * busy_for.as_secs_f64() / idle_for.as_secs_f64();
    assert!(
        sum(&busy) as f64 <= expected + phase,
        "idle {idle:?} in {idle_for:?}, under load {busy:?} in {busy_for:?}"
    );
    // One HWM txn per hwm.renew_interval (1 s): about 6 per window.
    let txn = busy[0].1;
    assert!((4..=8).contains(&txn), "{txn} HWM writes in 6 s");
    // The registration check asks the node's own agent, never the
    // servers for every instance's health (which grows with the cluster).
    let count = |v: &[(&str, u64)], e: &str| v.iter().find(|(n, _)| *n == e).map_or(0, |(_, n)| *n);
    assert_eq!(
        count(&busy, "health/service") + count(&idle, "health/service"),
        0,
        "{busy:?}"
    );
    assert!(
        count(&busy, "agent/services") + count(&idle, "agent/services") >= 1,
        "{busy:?}"
    );
    assert!(node.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lock_is_taken_away_stops_at_its_next_mark_write_and_claims_again() {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), "l", consul.addr());
    let before = common::snowflake_ids(&node, 1000).await.unwrap();
    let worker = worker_of(before[0]);
    let session = consul.sessions()[0].id.clone();
    // An operator deletes the lock key: the session lives on and renews
    // keep succeeding, but the node no longer holds its worker id.
    let admin = common::consul::default_client(&consul);
    admin
        .kv_delete(&format!("idgen/test/workers/0/{worker}"), None)
        .await
        .unwrap();
    // The next mark write (every second) is refused, and the node fences
    // on that refusal (not when its mark runs out, which logs otherwise).
    // Fencing and re-claiming can take only milliseconds on loopback, so
    // the log says when it happened, not a poll for errors.
    let cut = Instant::now();
    let mut seen: HashSet<u64> = before.into_iter().collect();
    while !node.log_text().contains("no longer holds its worker id") {
        assert!(cut.elapsed() < Duration::from_secs(10), "never fenced");
        if let Ok(id) = one(&node).await {
            assert!(seen.insert(id), "duplicate {id}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!node.log_text().contains("high-water mark not extended"));
    // ... and claims again with a new session, above every earlier ID.
    let after = loop {
        if let Ok(got) = common::snowflake_ids(&node, 1000).await {
            if node.log_text().contains("claimed again") {
                break got;
            }
            seen.extend(got);
        }
        assert!(cut.elapsed() < Duration::from_secs(15), "never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(consul.sessions().iter().all(|s| s.id != session));
    assert!(after.iter().all(|id| seen.insert(*id)), "no ID twice");
    assert!(node.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_ids_from_three_cluster_nodes_are_distinct_and_increase_per_node() {
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let segment = [
        ("segment", "enabled", "true"),
        ("segment", "auto_create", "true"),
        ("segment", "default_step", "200"),
    ];
    let nodes: Vec<ChildServer> = (0..3)
        .map(|i| {
            ChildServer::start(&write_cluster_config(
                dir.path(),
                &format!("s{i}"),
                consul.addr(),
                &segment,
            ))
        })
        .collect();
    let mut tasks = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for k in 0..3 {
            let mut c = n.client().await;
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for j in 0..40 {
                    let count = 1 + ((i * 31 + k * 7 + j * 11) % 150) as u32;
                    let ids = c
                        .gen_ids(GenIdsRequest {
                            mode: Mode::Segment as i32,
                            tag: "invoices".into(),
                            count,
                        })
                        .await
                        .expect("segment ids")
                        .into_inner()
                        .ids;
                    got.extend(ids);
                }
                got
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        let got = t.await.unwrap();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "increasing per caller");
        all.extend(got);
    }
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "duplicates across nodes");
    let record = consul
        .kv_get("idgen/test/segments/invoices")
        .expect("tag record");
    let record: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
    assert!(record["max_id"].as_u64().unwrap() >= *all.iter().max().unwrap());
    for n in nodes {
        assert!(n.terminate().success());
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Calls `node` for batches of 50 snowflake IDs until `stop`, collecting
/// what it got; errors (a fenced node) are retried after 20 ms.
async fn load(node: &ChildServer, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<u64>> {
    let mut c = node.client().await;
    tokio::spawn(async move {
        let mut got = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let req = GenIdsRequest {
                mode: Mode::Snowflake as i32,
                tag: String::new(),
                count: 50,
            };
            match c.gen_ids(req).await {
                Ok(r) => got.extend(r.into_inner().ids),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        got
    })
}

/// Leader elections (every session timer restarted at 2 x TTL, lock-delays
/// forgotten) under load: no ID twice; and a node cut off from Consul
/// stops at its own local deadline although the election keeps its
/// session alive at Consul for 2 x TTL more, while its id is taken by a
/// successor only after that restarted expiry plus lock-delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_elections_under_load_never_repeat_an_id_and_a_cut_off_node_still_stops_at_its_own_deadline(
) {
    const TTL: Duration = Duration::from_secs(2);
    // The node's lease lifetime: min(TTL, lock-delay) - margin (800 ms).
    const LIFETIME_MS: u64 = 1200;
    let consul = consul(None).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = consul.add_agent("agent-p").await.unwrap();
    let p = start(dir.path(), "p", agent);
    let q = start(dir.path(), "q", consul.addr());
    let r = start(dir.path(), "r", consul.addr());
    let p_worker = worker_of(one(&p).await.unwrap());
    let p_session = consul
        .sessions()
        .into_iter()
        .find(|s| s.node == "agent-p")
        .expect("p's session")
        .id;

    let stop = Arc::new(AtomicBool::new(false));
    let loads = [
        load(&q, Arc::clone(&stop)).await,
        load(&r, Arc::clone(&stop)).await,
        load(&q, Arc::clone(&stop)).await,
    ];
    // Elections while every node is healthy and busy.
    let mut p_ids = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(consul.faults().leader_election(), 3, "three sessions");
        p_ids.extend(
            common::snowflake_ids(&p, 100)
                .await
                .expect("p issues across elections"),
        );
    }
    assert_eq!(consul.sessions().len(), 3, "an election ends no session");

    // Cut p off, then elect: Consul now keeps p's session until 2 x TTL
    // after this election, far beyond p's own deadline.
    consul.faults().drop_requests("agent-p", true);
    let cut_ms = unix_ms();
    tokio::time::sleep(Duration::from_millis(300)).await;
    consul.faults().leader_election();
    let elected = Instant::now();
    let fenced = loop {
        match one(&p).await {
            Ok(id) => p_ids.push(id),
            Err(status) => break status,
        }
        assert!(
            elected.elapsed() < Duration::from_secs(5),
            "p never stopped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(fenced.code(), tonic::Code::Unavailable, "{fenced:?}");
    assert!(
        fenced.message().contains("lost its worker lock"),
        "{fenced:?}"
    );
    assert!(
        consul.sessions().iter().any(|s| s.id == p_session),
        "p's session lives on at Consul after the election"
    );
    // Every renew p got answered was sent before the cut, so its deadline
    // is at most cut + lifetime. An ID's time is never behind the wall
    // clock it was issued at; 300 ms covers scheduling of the fencing task.
    let last_p = p_ids.iter().map(|id| time_of(*id)).max().unwrap();
    assert!(
        last_p <= cut_ms + LIFETIME_MS + 300,
        "p issued an ID {} ms after the cut, past its deadline ({LIFETIME_MS} ms)",
        last_p.saturating_sub(cut_ms)
    );

    // A successor asking for exactly p's id gets it only once the restarted
    // timer (2 x TTL after the election) and the lock-delay are over.
    let successor = write_cluster_config(
        dir.path(),
        "successor",
        consul.addr(),
        &[
            ("consul", "worker", "\"static\""),
            ("node", "worker_id", &p_worker.to_string()),
        ],
    );
    let next = loop {
        match ChildServer::try_start(&successor, &[]) {
            Ok(node) => break node,
            Err(log) => {
                assert!(log.contains("held by another node"), "{log}");
                assert!(elected.elapsed() < Duration::from_secs(15), "never freed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let claimed_after = elected.elapsed();
    assert!(
        claimed_after >= 2 * TTL + LOCK_DELAY,
        "p's id was taken {claimed_after:?} after the election, before 2 x TTL + lock-delay"
    );
    let successor_ids = common::snowflake_ids(&next, 1000).await.unwrap();
    assert_eq!(worker_of(successor_ids[0]), p_worker);

    stop.store(true, Ordering::SeqCst);
    let mut seen = HashSet::new();
    let mut total = 0;
    for (what, batch) in [("p", p_ids), ("successor", successor_ids)] {
        total += batch.len();
        for id in batch {
            assert!(seen.insert(id), "{what}: {id} twice");
        }
    }
    for task in loads {
        let got = task.await.unwrap();
        assert!(!got.is_empty(), "the load ran");
        total += got.len();
        for id in got {
            assert!(seen.insert(id), "{id} twice");
        }
    }
    assert_eq!(seen.len(), total);
    assert!(next.terminate().success());
    consul.faults().drop_requests("agent-p", false);
    for n in [p, q, r] {
        assert!(n.terminate().success());
    }
}
