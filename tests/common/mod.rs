//! Shared helpers for the integration tests: an in-process server on
//! ephemeral ports, and the real `idgen` binary as a child process.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idgen::config::{Config, FileConfig};
use idgen::id::{Clock, SystemClock};
use idgen::node::{Node, ShutdownReport};
use idgen::proto::id_gen_client::IdGenClient;
use tokio::net::TcpListener;
use tonic::transport::Channel;

pub mod consul;
pub mod tls;

// Not every test binary starts a Consul test server.
#[allow(unused_imports)]
pub use consul::test_consul;

/// A server running inside the test process.
pub struct TestServer {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<ShutdownReport, idgen::node::ServeError>>,
}

/// [`test_config`] with segment (auto-create, ranges of 100), lease
/// (blocks of 100) and strict mode enabled.
pub fn all_modes_config(dir: &Path) -> Config {
    let mut c = test_config(dir);
    c.segment = Some(idgen::config::SegmentModeSettings {
        auto_create: true,
        default_step: 100,
        max_step: 10_000,
        ..Default::default()
    });
    c.lease = Some(idgen::config::LeaseModeSettings {
        zone: 0,
        token: Some(0),
        block: 100,
        hide: None,
    });
    c.strict = Some(idgen::config::StrictModeSettings {
        default_step: 1,
        ..Default::default()
    });
    c
}

/// A config for tests: state file in `dir`, created if missing.
pub fn test_config(dir: &Path) -> Config {
    let mut f = FileConfig::default();
    f.store.path = dir.join("state.redb");
    f.store.init_if_missing = true;
    f.server.grpc_listen = "127.0.0.1:0".into();
    f.server.http_listen = "127.0.0.1:0".into();
    f.validate(SystemClock.now_millis())
        .expect("test config is valid")
}

impl TestServer {
    pub async fn start(config: Config) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let node = Node::start(config, clock).await.expect("node starts");
        let grpc_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = grpc_l.local_addr().unwrap();
        let http = http_l.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(node.serve(grpc_l, http_l, async {
            let _ = stopped.await;
        }));
        Self {
            grpc,
            http,
            stop: Some(stop),
            task,
        }
    }

    pub async fn client(&self) -> IdGenClient<Channel> {
        IdGenClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connects")
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// Clean shutdown; returns what the server stored.
    pub async fn stop(mut self) -> ShutdownReport {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), &mut self.task)
            .await
            .expect("shutdown within 20 s")
            .expect("server task")
            .expect("clean shutdown")
    }
}

/// The `idgen` binary under test.
pub fn idgen_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_idgen"))
}

/// Writes a config file for a child process: loopback ephemeral ports,
/// JSON logs (so the test can read the bound addresses), state in `dir`.
pub fn write_child_config(dir: &Path, init_if_missing: bool) -> PathBuf {
    let path = dir.join("idgen.toml");
    let text = format!(
        "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [store]\npath = \"{}\"\ninit_if_missing = {init_if_missing}\n\
         [log]\nformat = \"json\"\nlevel = \"info\"\n",
        dir.join("state.redb").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A running `idgen serve` child.
pub struct ChildServer {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub log: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ChildServer {
    /// Starts `idgen serve --config <config>` and waits (bounded) for its
    /// "ready" log line.
    pub fn start(config: &Path) -> Self {
        Self::try_start(config, &[])
            .unwrap_or_else(|log| panic!("idgen did not become ready: {log}"))
    }

    /// Starts `idgen serve --config <config> <extra>`; `Err` with its log
    /// if it exits (or is not ready within 20 s) instead of becoming ready.
    pub fn try_start(config: &Path, extra: &[&str]) -> Result<Self, String> {
        Self::try_start_env(config, extra, &[])
    }

    /// Like [`ChildServer::try_start`] with extra environment variables
    /// (`IDGEN_...` overrides) for the child.
    pub fn try_start_env(
        config: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        Self::spawn(Command::new(idgen_bin()), config, extra, env)
    }

    /// Starts `idgen serve --config <config>` with at most `nofile` open
    /// descriptors (through util-linux `prlimit`, which execs it: the pid
    /// is idgen's).
    pub fn start_with_nofile(config: &Path, nofile: u32) -> Self {
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--nofile={nofile}:{nofile}"))
            .arg("--")
            .arg(idgen_bin());
        Self::spawn(command, config, &[], &[])
            .unwrap_or_else(|log| panic!("idgen did not become ready: {log}"))
    }

    fn spawn(
        mut command: Command,
        config: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let mut child = command
            .args(["serve", "--config"])
            .arg(config)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env_remove("RUST_LOG")
            .spawn()
            .expect("spawn idgen");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("\"ready\"") {
                        let _ = tx.send(Some(line.clone()));
                    }
                    log.lock().unwrap().push(line);
                }
                // stderr closed: the process exited.
                let _ = tx.send(None);
            });
        }
        let ready = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Some(line)) => line,
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(log.lock().unwrap().join("\n"));
            }
        };
        let v: serde_json::Value = serde_json::from_str(&ready).expect("JSON log line");
        let addr = |k: &str| -> SocketAddr {
            v["fields"][k]
                .as_str()
                .expect("address field")
                .parse()
                .expect("address")
        };
        Ok(Self {
            grpc: addr("grpc"),
            http: addr("http"),
            child,
            log,
        })
    }

    /// Everything the process logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Whether the log holds `line` within 10 s (100 looks, 100 ms apart):
    /// lines a node logs after "ready" ("idgen serving", its Consul
    /// registration) come a moment later.
    pub async fn logs_within_10s(&self, line: &str) -> bool {
        for _ in 0..100 {
            if self.log_text().contains(line) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    pub async fn client(&self) -> IdGenClient<Channel> {
        IdGenClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connects")
    }

    /// kill -9.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("idgen did not exit within 10 s of SIGTERM");
    }
}

impl Drop for ChildServer {
    /// A test that fails half-way must not leave the process running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `idgen <args>` to completion and returns (success, stderr +
/// stdout). A command still running after 20 s is killed and fails the test.
pub fn run_idgen(args: &[&str]) -> (bool, String) {
    run_idgen_with_env(args, &[])
}

/// `idgen admin --addr <node> --token <token> <args>`, off the async
/// runtime: (success, stderr + stdout), as [`run_idgen`].
pub async fn admin_cli(node: &ChildServer, token: &str, args: &[&str]) -> (bool, String) {
    let addr = format!("http://{}", node.grpc);
    let mut all: Vec<String> = ["admin", "--addr", &addr, "--token", token]
        .iter()
        .map(|s| s.to_string())
        .collect();
    all.extend(args.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run_idgen(&refs)
    })
    .await
    .expect("admin command")
}

/// [`run_idgen`] with extra environment variables.
pub fn run_idgen_with_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut child = Command::new(idgen_bin())
        .args(args)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idgen");
    for _ in 0..400 {
        if child.try_wait().expect("wait").is_some() {
            let out = child.wait_with_output().expect("output");
            return (
                out.status.success(),
                String::from_utf8_lossy(&out.stderr).into_owned()
                    + &String::from_utf8_lossy(&out.stdout),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("idgen {args:?} still running after 20 s");
}

/// Polls `url` until it answers HTTP `status` (at most 50 tries, 20 ms
/// apart); true if it did.
pub async fn wait_for_status(url: &str, status: u16) -> bool {
    for _ in 0..50 {
        if let Ok(resp) = reqwest::get(url).await {
            if resp.status().as_u16() == status {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// [`write_cluster_config`] for a node of one Consul datacenter (the
/// agent at `consul`) with `node.datacenter_id = datacenter_id` and `dc1`
/// as the primary datacenter, plus `set`.
pub fn write_datacenter_config(
    dir: &Path,
    name: &str,
    consul: SocketAddr,
    datacenter_id: u64,
    set: &[(&str, &str, &str)],
) -> PathBuf {
    let id = datacenter_id.to_string();
    let mut all = vec![
        ("node", "datacenter_id", id.as_str()),
        ("consul", "primary_datacenter", "\"dc1\""),
    ];
    all.extend_from_slice(set);
    write_cluster_config(dir, name, consul, &all)
}

/// A cluster-mode config file for a child `idgen serve`: Consul backend at
/// `consul`, instance `name`, short lease timings (TTL 2 s, lock-delay
/// 2 s, margin 800 ms), JSON logs. `set` overrides or adds keys as
/// `("section", "key", "toml value")`.
///
/// A 2 s TTL is below real Consul's 10 s minimum, so the file also sets the
/// test-only `testing.consul_session_ttl_min = "1s"`; start the test server
/// with `Config { min_ttl: 1s, .. }` (its mirror of Consul's
/// `session_ttl_min`) to match.
pub fn write_cluster_config(
    dir: &Path,
    name: &str,
    consul: SocketAddr,
    set: &[(&str, &str, &str)],
) -> PathBuf {
    use std::collections::BTreeMap;
    let consul_url = format!("\"http://{consul}\"");
    let name_value = format!("\"{name}\"");
    let index_file = format!("\"{}\"", dir.join(format!("{name}.index.json")).display());
    let mut sections: BTreeMap<&str, BTreeMap<&str, String>> = BTreeMap::new();
    let defaults: &[(&str, &str, &str)] = &[
        ("node", "instance_id", &name_value),
        ("server", "grpc_listen", "\"127.0.0.1:0\""),
        ("server", "http_listen", "\"127.0.0.1:0\""),
        ("server", "shutdown_grace", "\"5s\""),
        ("store", "backend", "\"consul\""),
        ("consul", "address", &consul_url),
        ("consul", "cluster", "\"test\""),
        ("consul", "index_file", &index_file),
        ("consul", "session_ttl", "\"2s\""),
        ("testing", "consul_session_ttl_min", "\"1s\""),
        ("consul", "lock_delay", "\"2s\""),
        ("consul", "lock_margin", "\"800ms\""),
        ("consul", "timeout", "\"500ms\""),
        ("consul", "retries", "1"),
        ("consul", "check_interval", "\"200ms\""),
        ("consul", "check_timeout", "\"200ms\""),
        ("consul", "deregister_critical_after", "\"1s\""),
        ("consul", "reclaim_backoff_max", "\"500ms\""),
        ("log", "format", "\"json\""),
        ("log", "level", "\"info\""),
    ];
    for (section, key, value) in defaults.iter().chain(set) {
        sections
            .entry(section)
            .or_default()
            .insert(key, value.to_string());
    }
    let mut text = String::new();
    for (section, keys) in sections {
        text.push_str(&format!("[{section}]\n"));
        for (k, v) in keys {
            text.push_str(&format!("{k} = {v}\n"));
        }
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The layout the test configs use (the default, twitter).
pub fn default_layout() -> idgen::id::Layout {
    FileConfig::default()
        .layout(SystemClock.now_millis())
        .expect("default layout")
}

/// Runs `promtool check metrics` on an exposition, when promtool is
/// installed (CI installs it and sets `REQUIRE_PROMTOOL`, making it a must).
pub fn check_with_promtool(text: &str) {
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(e) => {
            assert!(
                std::env::var_os("REQUIRE_PROMTOOL").is_none(),
                "promtool required but not runnable: {e}"
            );
            eprintln!("promtool not installed; checked with the built-in parser only");
        }
    }
}

/// The value of the first sample of `name` (with any labels) in an
/// exposition.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Calls `GenIds` with `request` over and over until `stop` is set or a
/// call fails (the server was killed), returning every ID it got: a caller
/// still in flight when a test kills or faults the server.
pub fn call_until_stopped(
    mut client: IdGenClient<Channel>,
    request: idgen::proto::GenIdsRequest,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<u64>> {
    tokio::spawn(async move {
        let mut got = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            match client.gen_ids(request.clone()).await {
                Ok(r) => got.extend(r.into_inner().ids),
                Err(_) => break,
            }
        }
        got
    })
}

/// One recorded strict call.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub start: std::time::Instant,
    pub end: std::time::Instant,
    pub first: u64,
    pub last: u64,
}

/// Strict mode's promise, checked from recorded times: all values are
/// distinct, and a call that finished before another started got smaller
/// values.
pub fn assert_linearizable(calls: &[Call]) {
    let mut values = std::collections::HashSet::new();
    for c in calls {
        for v in c.first..=c.last {
            assert!(values.insert(v), "value {v} handed out twice");
        }
    }
    let mut by_end: Vec<&Call> = calls.iter().collect();
    by_end.sort_by_key(|c| c.end);
    let mut by_start: Vec<&Call> = calls.iter().collect();
    by_start.sort_by_key(|c| c.start);
    // Sweep: for each call in start order, the largest value of every call
    // that ended before it started must be below its first value.
    let mut finished_max = 0u64;
    let mut e = 0;
    for b in by_start {
        while e < by_end.len() && by_end[e].end < b.start {
            finished_max = finished_max.max(by_end[e].last);
            e += 1;
        }
        assert!(
            b.first > finished_max,
            "a call that started after another finished got a smaller value: {} <= {finished_max}",
            b.first
        );
    }
}

/// `count` snowflake IDs from `node` in one GenIds call.
pub async fn snowflake_ids(node: &ChildServer, count: u32) -> Result<Vec<u64>, tonic::Status> {
    let mut c = node.client().await;
    c.gen_ids(idgen::proto::GenIdsRequest {
        mode: idgen::proto::Mode::Snowflake as i32,
        tag: String::new(),
        count,
    })
    .await
    .map(|r| r.into_inner().ids)
}

/// The gRPC health status a node reports for `idgen.v1.IdGen`.
pub async fn grpc_health(
    grpc: SocketAddr,
) -> tonic_health::pb::health_check_response::ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .expect("health endpoint")
        .connect()
        .await
        .expect("connects for a health check");
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "idgen.v1.IdGen".into(),
        })
        .await
        .expect("health check answers")
        .into_inner()
        .status()
}

type ServeTask = tokio::task::JoinHandle<Result<ShutdownReport, idgen::node::ServeError>>;

/// A serving in-process node that exposes its issuer (the formatted-ID
/// tests call the engine directly), and what stops it.
pub struct Running {
    pub issuer: Arc<idgen::modes::Issuer>,
    /// The gRPC port it serves (and advertises).
    pub grpc: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: ServeTask,
}

/// Starts `config` on `clock`, advertising its ephemeral gRPC port.
pub async fn start_node(mut config: Config, clock: Arc<dyn Clock>) -> Running {
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    config.node.advertise = Some(addr);
    let node = Node::start(config, clock).await.expect("node starts");
    let issuer = Arc::clone(node.issuer());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(node.serve(grpc, http, async {
        let _ = stopped.await;
    }));
    Running {
        issuer,
        grpc: addr,
        stop,
        task,
    }
}

impl Running {
    /// A clean stop: the worker id and tokens are released and the state
    /// file is closed when this returns.
    pub async fn stop(self) -> ShutdownReport {
        drop(self.issuer);
        let _ = self.stop.send(());
        self.task.await.unwrap().expect("clean stop")
    }

    /// Asks the node to stop and waits at most `limit`, whatever the
    /// outcome (a node that refuses to issue may not stop cleanly).
    pub async fn stop_within(self, limit: Duration) {
        drop(self.issuer);
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(limit, self.task).await;
    }
}

/// [`write_cluster_config`] for node `name` with the Consul token `master`
/// and a per-node daily format `orders-py` (`{yyyy}{MM}{dd}-{node:4}-{seq:6}`,
/// safe on several nodes): the clients' ACL and formatted-ID tests.
pub fn write_format_cluster_config(dir: &Path, name: &str, consul: SocketAddr) -> PathBuf {
    let path = write_cluster_config(dir, name, consul, &[("consul", "token", "\"master\"")]);
    let mut text = std::fs::read_to_string(&path).expect("the config just written");
    text.push_str(
        "\n[[formats]]\nname = \"orders-py\"\ntemplate = \"{yyyy}{MM}{dd}-{node:4}-{seq:6}\"\nreset = \"day\"\n",
    );
    std::fs::write(&path, text).expect("write the config");
    path
}

/// Admin `<verb>HideKey` (`create`, `rotate` or `retire`) of `key` on
/// `node`, with admin `token`; panics naming the call if it is refused.
pub async fn hide_key(node: &ChildServer, token: &str, verb: &str, key: &str) {
    use idgen::proto::admin_client::AdminClient;
    let mut admin = AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .unwrap();
    let key_id = key.to_owned();
    let done = match verb {
        "create" => admin
            .create_hide_key(tonic_req(
                token,
                idgen::proto::CreateHideKeyRequest { key_id },
            ))
            .await
            .map(drop),
        "rotate" => admin
            .rotate_hide_key(tonic_req(
                token,
                idgen::proto::RotateHideKeyRequest {
                    key_id,
                    force: false,
                },
            ))
            .await
            .map(drop),
        "retire" => admin
            .retire_hide_key(tonic_req(
                token,
                idgen::proto::RetireHideKeyRequest { key_id },
            ))
            .await
            .map(drop),
        other => panic!("no verb {other}"),
    };
    done.unwrap_or_else(|e| panic!("{verb} hide key {key}: {e:?}"));
}

/// `msg` with admin `token` as its bearer credential.
pub fn tonic_req<T>(token: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    let bearer = format!("Bearer {token}").parse().unwrap();
    r.metadata_mut().insert("authorization", bearer);
    r
}

/// `n` IDs of format `format` (GenFormatted, no parameters).
pub async fn formatted_ids(
    c: &mut IdGenClient<Channel>,
    format: &str,
    n: u32,
) -> Result<Vec<String>, tonic::Status> {
    Ok(c.gen_formatted(idgen::proto::GenFormattedRequest {
        format: format.into(),
        params: Default::default(),
        count: n,
    })
    .await?
    .into_inner()
    .ids)
}

/// `n` lease IDs (GenIds in lease mode).
pub async fn lease_ids(c: &mut IdGenClient<Channel>, n: u32) -> Result<Vec<u64>, tonic::Status> {
    Ok(c.gen_ids(idgen::proto::GenIdsRequest {
        mode: idgen::proto::Mode::Lease as i32,
        tag: String::new(),
        count: n,
    })
    .await?
    .into_inner()
    .ids)
}

/// `GET http://<http><path>` with the admin token as a bearer, as JSON
/// (`Null` for a body that is not JSON).
#[allow(dead_code)]
pub async fn admin_json(http: SocketAddr, path: &str, token: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("http://{http}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("HTTP answer")
        .json()
        .await
        .unwrap_or_default()
}

/// The text of `node`'s `/metrics`.
pub async fn metrics_text(node: &ChildServer) -> String {
    reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics body")
}
