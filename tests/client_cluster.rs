//! The idgen-client crate against real `idgen serve` processes on the
//! Consul test server: discovery, failover (SIGKILL and SIGTERM under
//! load), nodes joining, Consul unreachable, strict linearizability.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_linearizable, test_consul, write_cluster_config, Call, ChildServer};
use idgen_client::{Client, ConsulDiscovery, Mode, PrefetchConfig};

/// The worker field of a default-layout snowflake ID.
fn worker_of(id: u64) -> u64 {
    (id >> 12) & 0x1f
}

fn start(dir: &Path, name: &str, consul: SocketAddr, set: &[(&str, &str, &str)]) -> ChildServer {
    ChildServer::start(&write_cluster_config(dir, name, consul, set))
}

/// Three cluster nodes `a`, `b`, `c`, once Consul lists them passing.
async fn three_nodes(dir: &Path, consul: SocketAddr) -> Vec<ChildServer> {
    let nodes = ["a", "b", "c"]
        .iter()
        .map(|n| start(dir, n, consul, &[]))
        .collect();
    wait_passing(consul, 3).await;
    nodes
}

/// Passing `idgen` instances as Consul lists them.
async fn passing(consul: SocketAddr) -> Vec<serde_json::Value> {
    let url = format!("http://{consul}/v1/health/service/idgen?passing");
    match reqwest::get(url).await {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// Waits (at most 10 s) until Consul lists `n` passing instances.
async fn wait_passing(consul: SocketAddr, n: usize) {
    for _ in 0..200 {
        if passing(consul).await.len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "Consul did not list {n} passing idgen nodes: {:?}",
        passing(consul).await
    );
}

/// Waits (at most 10 s) until the client knows exactly `n` nodes.
async fn wait_known(client: &Client, n: usize) {
    for _ in 0..200 {
        if client.nodes().len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the client knows {:?}, not {n} nodes", client.nodes());
}

async fn consul_client(agent: SocketAddr, deadline: Duration) -> Client {
    Client::builder()
        .consul(ConsulDiscovery::new(format!("http://{agent}")).wait(Duration::from_secs(5)))
        .deadline(deadline)
        .set_aside(Duration::from_millis(300))
        .build()
        .await
        .expect("client starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_discovers_three_nodes_in_consul_and_spreads_calls_over_them() {
    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), consul.addr()).await;

    // The registration carries the metrics port for Prometheus.
    let listed = passing(consul.addr()).await;
    let mut ports: Vec<String> = listed
        .iter()
        .map(|e| {
            e["Service"]["Meta"]["metrics_port"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    let mut want: Vec<String> = nodes.iter().map(|n| n.http.port().to_string()).collect();
    ports.sort();
    want.sort();
    assert_eq!(ports, want, "Meta.metrics_port is each node's HTTP port");

    let app = consul.add_agent("app").await.unwrap();
    let client = consul_client(app, Duration::from_secs(2)).await;
    let mut known = client.nodes();
    known.sort();
    let mut grpc: Vec<String> = nodes.iter().map(|n| n.grpc.to_string()).collect();
    grpc.sort();
    assert_eq!(known, grpc, "the client dials exactly the registered nodes");

    let mut workers = HashSet::new();
    let mut ids = HashSet::new();
    for _ in 0..300 {
        let id = client.gen_id(Mode::Snowflake, "").await.expect("gen_id");
        assert!(ids.insert(id), "id {id} twice");
        workers.insert(worker_of(id));
    }
    assert_eq!(workers.len(), 3, "every node served calls: {workers:?}");
    drop(nodes);
    consul.shutdown().await;
}

/// What one load task got: IDs, errors, and its longest call.
type LoadOutcome = (Vec<u64>, Vec<String>, Duration);

/// Calls `next_id` (prefetched snowflake) and `gen_id` from `tasks` tasks
/// until `stop`; returns the IDs and every error.
fn load(
    client: &Client,
    tasks: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<LoadOutcome>> {
    (0..tasks)
        .map(|t| {
            let (client, stop) = (client.clone(), Arc::clone(stop));
            tokio::spawn(async move {
                let (mut ids, mut errors, mut longest) = (Vec::new(), Vec::new(), Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let got = if t % 2 == 0 {
                        client.next_id(Mode::Snowflake, "").await
                    } else {
                        client.gen_id(Mode::Snowflake, "").await
                    };
                    longest = longest.max(started.elapsed());
                    match got {
                        Ok(id) => ids.push(id),
                        Err(e) => errors.push(e.to_string()),
                    }
                    if t % 2 == 1 {
                        // Unbuffered callers pace themselves a little.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                (ids, errors, longest)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_and_a_node_drained_under_load_cost_the_application_no_error_and_no_duplicate(
) {
    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<ChildServer> = ["a", "b", "c"]
        .iter()
        .map(|n| start(dir.path(), n, consul.addr(), &[]))
        .collect();
    wait_passing(consul.addr(), 3).await;
    let app = consul.add_agent("app").await.unwrap();
    let deadline = Duration::from_secs(3);
    let client = Client::builder()
        .consul(ConsulDiscovery::new(format!("http://{app}")).wait(Duration::from_secs(5)))
        .deadline(deadline)
        .set_aside(Duration::from_millis(300))
        .prefetch(PrefetchConfig {
            initial_batch: 200,
            min_batch: 50,
            ..PrefetchConfig::default()
        })
        .build()
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&client, 8, &stop);

    tokio::time::sleep(Duration::from_millis(700)).await;
    let killed = nodes.remove(0);
    killed.kill();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let drained = nodes.remove(0);
    let status = tokio::task::spawn_blocking(move || drained.terminate())
        .await
        .unwrap();
    assert!(status.success(), "the drained node exits cleanly: {status}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);

    let (mut all, mut errors, mut longest) = (Vec::new(), Vec::new(), Duration::ZERO);
    for t in tasks {
        let (ids, errs, l) = t.await.unwrap();
        all.extend(ids);
        errors.extend(errs);
        longest = longest.max(l);
    }
    assert!(errors.is_empty(), "the application saw errors: {errors:?}");
    assert!(
        longest < deadline,
        "a call took {longest:?}, over its deadline"
    );
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "an ID was handed out twice");
    assert!(all.len() > 1000, "the load ran: {} IDs", all.len());
    // Calls after the failures went to the one node left.
    let last = client.gen_id(Mode::Snowflake, "").await.unwrap();
    assert!(!distinct.contains(&last));
    drop(nodes);
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_later_receives_traffic() {
    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<ChildServer> = ["a", "b"]
        .iter()
        .map(|n| start(dir.path(), n, consul.addr(), &[]))
        .collect();
    wait_passing(consul.addr(), 2).await;
    let app = consul.add_agent("app").await.unwrap();
    let client = consul_client(app, Duration::from_secs(2)).await;
    assert_eq!(client.nodes().len(), 2);

    nodes.push(start(dir.path(), "c", consul.addr(), &[]));
    // One blocking-query round picks it up once its check passes.
    wait_known(&client, 3).await;
    assert!(client.nodes().contains(&nodes[2].grpc.to_string()));

    let newcomer = {
        let mut c = nodes[2].client().await;
        let id = c
            .gen_id(idgen::proto::GenIdRequest {
                mode: Mode::Snowflake as i32,
                tag: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .id;
        worker_of(id)
    };
    let mut served = 0;
    for _ in 0..300 {
        let id = client.gen_id(Mode::Snowflake, "").await.unwrap();
        if worker_of(id) == newcomer {
            served += 1;
        }
    }
    assert!(served > 0, "the new node got none of 300 calls");
    drop(nodes);
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_consul_unreachable_calls_continue_on_the_known_nodes() {
    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), consul.addr()).await;
    // The application's own agent goes away; the nodes keep theirs (a
    // Consul the nodes cannot reach either would fence them: see DESIGN).
    let app = consul.add_agent("app").await.unwrap();
    let client = consul_client(app, Duration::from_secs(2)).await;
    consul.faults().refuse("app", true);
    let refused_at = Instant::now();
    let mut ids = HashSet::new();
    let mut workers = HashSet::new();
    while refused_at.elapsed() < Duration::from_secs(3) {
        let id = client
            .gen_id(Mode::Snowflake, "")
            .await
            .expect("calls go on without Consul");
        assert!(ids.insert(id));
        workers.insert(worker_of(id));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(client.nodes().len(), 3, "the last known set is kept");
    assert_eq!(workers.len(), 3, "all known nodes still serve");
    // Consul back: the watch resumes (a node leaving is seen again).
    consul.faults().refuse("app", false);
    let mut nodes = nodes;
    let gone = nodes.pop().unwrap();
    let status = tokio::task::spawn_blocking(move || gone.terminate())
        .await
        .unwrap();
    assert!(status.success());
    wait_known(&client, 2).await;
    drop(nodes);
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_calls_from_16_tasks_through_the_client_stay_linearizable() {
    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let strict = [("strict", "enabled", "true")];
    let nodes: Vec<ChildServer> = ["a", "b", "c"]
        .iter()
        .map(|n| start(dir.path(), n, consul.addr(), &strict))
        .collect();
    wait_passing(consul.addr(), 3).await;
    let app = consul.add_agent("app").await.unwrap();
    let client = consul_client(app, Duration::from_secs(5)).await;
    assert!(
        matches!(
            client.prefetcher(Mode::Strict, "books/moby"),
            Err(idgen_client::Error::StrictNotPrefetchable)
        ),
        "strict is never prefetched"
    );
    let calls = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (client, calls) = (client.clone(), Arc::clone(&calls));
            tokio::spawn(async move {
                for i in 0..12 {
                    let start = Instant::now();
                    let (first, last) = if (t + i) % 3 == 0 {
                        let v = client
                            .gen_ids(Mode::Strict, "books/moby", 3)
                            .await
                            .expect("strict batch");
                        assert_eq!(v.len(), 3);
                        (v[0], v[2])
                    } else {
                        let v = client
                            .next_id(Mode::Strict, "books/moby")
                            .await
                            .expect("strict");
                        (v, v)
                    };
                    let end = Instant::now();
                    calls.lock().unwrap().push(Call {
                        start,
                        end,
                        first,
                        last,
                    });
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 16 * 12);
    assert_linearizable(&calls);
    drop(nodes);
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_calls_are_retried_when_the_connection_was_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::TestServer::start(common::all_modes_config(dir.path())).await;
    // A port nobody listens on: the request provably never left.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let client = Client::builder()
        .endpoints([dead.to_string(), server.grpc.to_string()])
        .set_aside(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let mut last = 0;
    for _ in 0..20 {
        let v = client
            .gen_id(Mode::Strict, "seats/a1")
            .await
            .expect("refused connections are retried on the other node");
        assert!(v > last, "strict values increase: {v} after {last}");
        last = v;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idgen_gen_and_bench_with_consul_discovery_use_the_whole_cluster() {
    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(dir.path(), consul.addr()).await;
    let url = format!("http://{}", consul.addr());

    let gen_url = url.clone();
    let (ok, out) = tokio::task::spawn_blocking(move || {
        common::run_idgen(&[
            "gen",
            "--discover",
            "consul",
            "--consul",
            &gen_url,
            "-n",
            "300",
            "--batch",
            "1",
            "--json",
        ])
    })
    .await
    .unwrap();
    assert!(ok, "idgen gen --discover consul: {out}");
    let v: serde_json::Value = serde_json::from_str(out.trim().lines().last().unwrap()).unwrap();
    let ids: Vec<u64> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 300);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 300, "distinct");
    let workers: HashSet<u64> = ids.iter().map(|i| worker_of(*i)).collect();
    assert_eq!(
        workers.len(),
        3,
        "300 calls spread over the 3 nodes: {workers:?}"
    );

    let (ok, out) = tokio::task::spawn_blocking(move || {
        common::run_idgen(&[
            "bench",
            "--discover",
            "consul",
            "--consul",
            &url,
            "--duration",
            "1s",
            "--warmup",
            "0s",
            "--concurrency",
            "4",
            "--json",
        ])
    })
    .await
    .unwrap();
    assert!(ok, "idgen bench --discover consul: {out}");
    let v: serde_json::Value = serde_json::from_str(out.trim().lines().last().unwrap()).unwrap();
    assert!(
        v[0]["label"].as_str().unwrap_or("").contains("3 nodes"),
        "{v}"
    );
    assert_eq!(v[0]["errors"], 0, "{v}");
    assert!(v[0]["ids"].as_u64().unwrap_or(0) > 0, "{v}");
    drop(nodes);
    consul.shutdown().await;
}

/// A config file for an embedded child node on a fixed gRPC port with its
/// own worker id.
fn embedded_on(dir: &Path, port: u16, worker: u64) -> std::path::PathBuf {
    let path = dir.join("idgen.toml");
    let text = format!(
        "[node]\nworker_id = {worker}\n\
         [server]\ngrpc_listen = \"127.0.0.1:{port}\"\nhttp_listen = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [store]\npath = \"{}\"\ninit_if_missing = true\n\
         [log]\nformat = \"json\"\nlevel = \"info\"\n",
        dir.join("state.redb").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_is_set_aside_and_taken_back_once_its_health_check_passes() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a = common::TestServer::start(common::test_config(dir_a.path())).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config_b = embedded_on(dir_b.path(), port, 1);
    let b = ChildServer::start(&config_b);
    let client = Client::builder()
        .endpoints([a.grpc.to_string(), b.grpc.to_string()])
        .set_aside(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let mut workers = HashSet::new();
    for _ in 0..200 {
        workers.insert(worker_of(client.gen_id(Mode::Snowflake, "").await.unwrap()));
    }
    assert_eq!(workers, HashSet::from([0, 1]), "both nodes serve");

    b.kill();
    for _ in 0..200 {
        let id = client
            .gen_id(Mode::Snowflake, "")
            .await
            .expect("A takes over");
        assert_eq!(worker_of(id), 0);
    }

    // B comes back on the same address: the health probe puts it back.
    let _b = ChildServer::start(&config_b);
    let back = Instant::now();
    let mut served = false;
    while back.elapsed() < Duration::from_secs(10) && !served {
        served = worker_of(client.gen_id(Mode::Snowflake, "").await.unwrap()) == 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(served, "the node that came back got no call within 10 s");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_sends_its_acl_token_and_keeps_only_nodes_with_its_tag() {
    let consul = common::consul::acl_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let token = ("consul", "token", "\"master\"");
    let _nodes: Vec<ChildServer> = ["a", "b", "c"]
        .iter()
        .map(|n| start(dir.path(), n, consul.addr(), &[token]))
        .collect();
    let discovery = |token: Option<&str>, tag: &str| {
        let mut d = ConsulDiscovery::new(format!("http://{}", consul.addr()))
            .wait(Duration::from_secs(5))
            .tag(tag);
        if let Some(t) = token {
            d = d.token(t);
        }
        d
    };
    // Wait until the nodes are registered and passing (seen with the token).
    let mut known = Vec::new();
    for _ in 0..200 {
        if let Ok(client) = Client::builder()
            .consul(discovery(Some("reader"), "snowflake"))
            .build()
            .await
        {
            known = client.nodes();
            if known.len() == 3 {
                let id = client.gen_id(Mode::Snowflake, "").await.expect("gen_id");
                assert!(id > 0);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        known.len(),
        3,
        "with the token and the nodes' tag: {known:?}"
    );

    // Without a token Consul refuses the listing: the client does not start.
    let refused = Client::builder()
        .consul(discovery(None, "snowflake"))
        .build()
        .await;
    assert!(
        matches!(refused, Err(idgen_client::Error::Discovery(_))),
        "no token: {:?}",
        refused.err()
    );
    // A tag no node carries lists nobody: no node is known.
    match Client::builder()
        .consul(discovery(Some("reader"), "no-such-tag"))
        .build()
        .await
    {
        Ok(client) => assert!(client.nodes().is_empty(), "{:?}", client.nodes()),
        Err(e) => assert!(matches!(e, idgen_client::Error::Discovery(_)), "{e:?}"),
    }
    consul.shutdown().await;
}

/// An embedded node in `dir` with worker id `worker`.
fn embedded_node(dir: &Path, worker: u64) -> ChildServer {
    let path = common::write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("[node]\nworker_id = {worker}\n"));
    std::fs::write(&path, text).unwrap();
    ChildServer::start(&path)
}

fn signal(node: &ChildServer, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &node.child.id().to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill {sig}");
    if sig == "-STOP" {
        wait_until_stopped(node.child.id());
    }
}

/// `kill` returns once SIGSTOP is queued; a thread of the node that is on
/// a CPU at that moment runs on until the kernel's kick reaches it, and on
/// a loaded machine it can answer one more call first. Waits (bounded)
/// until every thread of `pid` is in state T (stopped).
fn wait_until_stopped(pid: u32) {
    let all_stopped = || -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.flatten().all(|task| {
            std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                // The state follows the command name's closing parenthesis.
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
            })
        })
    };
    for _ in 0..1000 {
        if all_stopped() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("node {pid} not stopped 5 s after SIGSTOP");
}

/// A node stopped with SIGSTOP accepts connections (the kernel does) and
/// never answers. Each call that meets it costs one attempt's share of the
/// deadline and is answered by the other node; nothing waits out the
/// whole deadline on it. When no node can answer, the error names the
/// node and says what happened in words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_costs_one_attempt_and_the_other_node_answers() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let stopped = embedded_node(dir_a.path(), 1);
    let healthy = embedded_node(dir_b.path(), 2);
    // Connections to both exist before the stop, as in a running client.
    let client = Client::builder()
        .endpoints([stopped.grpc.to_string(), healthy.grpc.to_string()])
        .deadline(Duration::from_secs(30))
        .attempt_timeout(Duration::from_millis(500))
        .set_aside(Duration::from_secs(60))
        .build()
        .await
        .expect("client starts");
    for _ in 0..10 {
        client.gen_id(Mode::Snowflake, "").await.expect("warm-up");
    }
    signal(&stopped, "-STOP");
    // Every call is answered, by the healthy node (worker 2): with the
    // whole deadline spent on the stopped node, the first call that met
    // it would have failed.
    let mut workers = HashSet::new();
    for _ in 0..20 {
        let (ids, node) = client
            .gen_ids_from(Mode::Snowflake, "", 1)
            .await
            .expect("answered by the other node");
        assert_eq!(node, healthy.grpc.to_string(), "the answering node");
        workers.extend(ids.into_iter().map(worker_of));
    }
    assert_eq!(
        workers,
        HashSet::from([2]),
        "answered by the healthy node only"
    );
    strict_calls_on_the_stopped_node_end_at_the_attempt_timeout(&stopped, &healthy).await;
    // With the healthy node gone too, the error says which node did what,
    // never a bare "Unknown: transport error".
    let healthy_addr = healthy.grpc.to_string();
    healthy.kill();
    let quick = Client::builder()
        .endpoints([healthy_addr.clone()])
        .deadline(Duration::from_secs(2))
        .build()
        .await
        .expect("client starts");
    let err = quick
        .gen_id(Mode::Strict, "ns/k")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&healthy_addr)
            && err.contains("connection refused")
            && !err.contains("Unknown"),
        "{err}"
    );
    signal(&stopped, "-CONT");
    drop(stopped);
}

/// Strict calls on a key of the `stopped` node, each from a fresh client
/// (a stalled strict call sets its node aside): each ends with the
/// attempt timeout after one attempt, never sent again, and never as a
/// transport failure. tonic ends a call at the `grpc-timeout` it sends,
/// the attempt's budget, often before the attempt timeout fires; that
/// used to count as a transport error: an HTTP/1.1 probe of the stopped
/// node on top of the budget, then UNAVAILABLE (in 39 of 50 conformance
/// runs; five rounds here).
async fn strict_calls_on_the_stopped_node_end_at_the_attempt_timeout(
    stopped: &ChildServer,
    healthy: &ChildServer,
) {
    let stopped_addr = stopped.grpc.to_string();
    for round in 0..5 {
        let fresh = Client::builder()
            .endpoints([stopped_addr.clone(), healthy.grpc.to_string()])
            .deadline(Duration::from_secs(30))
            .attempt_timeout(Duration::from_millis(300))
            .build()
            .await
            .expect("client starts");
        let key = (0..1000)
            .map(|i| format!("ns/k{i}"))
            .find(|k| fresh.strict_node(k).as_deref() == Some(stopped_addr.as_str()))
            .expect("a key of the stopped node");
        match fresh.gen_ids_from(Mode::Strict, &key, 1).await {
            Err(idgen_client::Error::DeadlineExceeded {
                last,
                attempts,
                nodes,
                ..
            }) => {
                assert_eq!((attempts, nodes), (1, 1), "round {round}: {last}");
                assert!(
                    last.contains(&stopped_addr)
                        && last.contains("attempt timeout")
                        && last.contains("not sent twice"),
                    "round {round}: {last}"
                );
            }
            other => panic!("round {round}: a strict call on the stopped node: {other:?}"),
        }
    }
}

/// `idgen gen --discover` with one of two passing nodes stopped (SIGSTOP;
/// registered by hand with a TTL check, so Consul keeps listing it): each
/// call that meets it moves on after a third of --timeout, and every ID
/// comes from the other node. With no node left that answers, the error
/// names the node and what happened in words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idgen_gen_discover_fails_over_from_a_stopped_node_and_says_why_it_failed() {
    let consul = test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let stopped_dir = tempfile::tempdir().unwrap();
    // Embedded, worker 31: the Consul node claims a low worker id.
    let stopped = embedded_node(stopped_dir.path(), 31);
    let healthy = start(dir.path(), "healthy", consul.addr(), &[]);
    let register = serde_json::json!({
        "ID": "idgen-stopped",
        "Name": "idgen",
        "Address": "127.0.0.1",
        "Port": stopped.grpc.port(),
        "Tags": ["snowflake"],
        "Check": {"CheckID": "idgen-stopped-ttl", "TTL": "600s", "Status": "passing"},
    });
    let resp = reqwest::Client::new()
        .put(format!(
            "http://{}/v1/agent/service/register",
            consul.addr()
        ))
        .json(&register)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text().await);
    wait_passing(consul.addr(), 2).await;
    signal(&stopped, "-STOP");
    let url = format!("http://{}", consul.addr());
    let gen = |url: String| {
        tokio::task::spawn_blocking(move || {
            common::run_idgen(&[
                "gen",
                "--discover",
                "consul",
                "--consul",
                &url,
                "-n",
                "6",
                "--batch",
                "1",
                "--timeout",
                "3s",
                "--json",
            ])
        })
    };
    let (ok, out) = gen(url.clone()).await.unwrap();
    assert!(ok, "idgen gen --discover with a stopped node: {out}");
    let v: serde_json::Value = serde_json::from_str(out.trim().lines().last().unwrap()).unwrap();
    let ids: Vec<u64> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 6, "{out}");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 6, "distinct");
    assert!(
        ids.iter().all(|id| worker_of(*id) != 31),
        "every ID from the node that answers: {ids:?}"
    );
    // Only the stopped node left: the failure names it and says why.
    healthy.kill();
    wait_passing(consul.addr(), 1).await;
    let (ok, out) = gen(url).await.unwrap();
    assert!(!ok, "{out}");
    assert!(
        out.contains(&stopped.grpc.to_string())
            && (out.contains("did not answer") || out.contains("does not answer")),
        "{out}"
    );
    assert!(
        !out.contains("Unknown: transport error") && !out.contains("Unknown transport error"),
        "{out}"
    );
    signal(&stopped, "-CONT");
    drop(stopped);
    consul.shutdown().await;
}
