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
use idgen::proto::id_gen_client::IdGenClient;
use idgen::server::{Node, ShutdownReport};
use tokio::net::TcpListener;
use tonic::transport::Channel;

/// A server running inside the test process.
pub struct TestServer {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<ShutdownReport, idgen::server::ServeError>>,
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
        let mut child = Command::new(idgen_bin())
            .args(["serve", "--config"])
            .arg(config)
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
                        let _ = tx.send(line.clone());
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let ready = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!("idgen did not become ready: {:?}", log.lock().unwrap());
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
        Self {
            grpc: addr("grpc"),
            http: addr("http"),
            child,
            log,
        }
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

/// Runs `idgen <args>` to completion and returns (success, stderr +
/// stdout). A command still running after 20 s is killed and fails the test.
pub fn run_idgen(args: &[&str]) -> (bool, String) {
    let mut child = Command::new(idgen_bin())
        .args(args)
        .env_remove("RUST_LOG")
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
