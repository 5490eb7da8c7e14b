//! The environment one document's blocks run in: a temporary directory
//! as CWD holding links to the repository's files, `idgen` (the binary
//! under test) first on PATH, and the services the markers ask for, all on
//! loopback and all stopped when the document is done.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use consul_testserver::{Config, TestConsul};

use super::blocks::Block;

/// The addresses the docs use for the development node (config/dev.toml).
pub const NODE_GRPC: &str = "127.0.0.1:50051";
/// The development node's HTTP address.
pub const NODE_HTTP: &str = "127.0.0.1:9464";
/// Where the docs' Consul agent listens (datacenter `dc1`, the primary).
pub const CONSUL_ADDR: &str = "127.0.0.1:8500";
/// Where the agent of the docs' second Consul datacenter, `dc2`, listens
/// (docs/CLUSTER.md, "Several datacenters").
pub const CONSUL_DC2_ADDR: &str = "127.0.0.1:8510";
/// The Consul emulator's ACL master token (consul/README.md, "The test
/// server").
pub const CONSUL_TOKEN: &str = "dev-master-token";
/// How long one block may run before it is killed (a generous bound, not
/// an assertion: blocks take well under a second each).
const BLOCK_DEADLINE: Duration = Duration::from_secs(120);
/// How long the node may take to answer `/readyz` 200.
const NODE_DEADLINE: Duration = Duration::from_secs(60);

/// What one block did.
pub struct Outcome {
    /// Its exit status (`None`: killed at the deadline).
    pub status: Option<ExitStatus>,
    /// What it wrote to stdout.
    pub stdout: String,
    /// What it wrote to stderr.
    pub stderr: String,
}

/// One document's environment.
pub struct DocEnv {
    dir: tempfile::TempDir,
    node: Option<Child>,
    consul: Option<(tokio::runtime::Runtime, TestConsul, TestConsul)>,
    /// The running `background` blocks, by line.
    background: Vec<(usize, Child)>,
}

impl DocEnv {
    /// A fresh temporary directory linking every top-level entry of the
    /// repository (but `target`, `.git`, and `data` and `gen`: blocks write
    /// a node's data and generated stubs there, which must land in the
    /// temporary directory, not in a checkout that has those folders),
    /// with `bin/idgen`.
    pub fn new(repo: &Path) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let entries = std::fs::read_dir(repo).map_err(|e| format!("{}: {e}", repo.display()))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if ["target", "data", "gen", ".git"].contains(&name.to_string_lossy().as_ref()) {
                continue;
            }
            std::os::unix::fs::symlink(entry.path(), dir.path().join(&name))
                .map_err(|e| format!("link {name:?}: {e}"))?;
        }
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).map_err(|e| format!("bin dir: {e}"))?;
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_idgen"), bin.join("idgen"))
            .map_err(|e| format!("link idgen: {e}"))?;
        // curl fails on an HTTP error status (and says so), as a reader
        // would notice an error answer: CURL_HOME points here in `run`.
        std::fs::write(dir.path().join(".curlrc"), "fail\nshow-error\nsilent\n")
            .map_err(|e| format!(".curlrc: {e}"))?;
        Ok(Self {
            dir,
            node: None,
            consul: None,
            background: Vec::new(),
        })
    }

    /// The directory the blocks run in.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// PATH for the blocks: the test's `idgen`, then the Python virtualenvs
    /// `scripts/setup.sh` makes (the installed client; grpcio-tools), then
    /// the caller's.
    fn path_var(&self) -> String {
        let mut parts = vec![self.path().join("bin")];
        // The Python client's virtualenv first (docs/CLIENT-PYTHON.md runs
        // `python` with it), then the one with grpcio-tools.
        for venv in ["idgen-client-venv/bin", "idgen-py-venv/bin"] {
            let venv = std::env::temp_dir().join(venv);
            if venv.is_dir() {
                parts.push(venv);
            }
        }
        let mut path = std::env::join_paths(parts)
            .map_or_else(|_| String::new(), |p| p.to_string_lossy().into_owned());
        if let Ok(rest) = std::env::var("PATH") {
            path = format!("{path}:{rest}");
        }
        path
    }

    /// Starts what `block`'s marker needs and is not running yet.
    pub fn prepare(&mut self, block: &Block) -> Result<(), String> {
        if block.marker.consul && self.consul.is_none() {
            self.consul = Some(start_consul(self.path())?);
        }
        if block.marker.node && self.node.is_none() {
            self.node = Some(start_node(self.path(), &self.path_var())?);
        }
        Ok(())
    }

    /// The development node's log so far (for a failure message).
    pub fn node_log(&self) -> Option<String> {
        self.node.as_ref()?;
        std::fs::read_to_string(self.path().join("node.log")).ok()
    }

    /// `block` as `bash -euo pipefail` in its own process group, in the
    /// document's session, writing to `out` and `err`.
    fn command(&self, block: &Block, out: &Path, err: &Path) -> Result<Command, String> {
        use std::os::unix::process::CommandExt as _;
        let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
        let mut command = Command::new("bash");
        command
            .args([
                "-euo",
                "pipefail",
                "-c",
                &session_script(block, self.path()),
            ])
            .current_dir(self.path())
            .env("PATH", self.path_var())
            .env_remove("IDGEN_CONFIG")
            .env("CURL_HOME", self.path())
            .stdin(Stdio::null())
            .stdout(file(out)?)
            .stderr(file(err)?)
            .process_group(0);
        if self.consul.is_some() {
            command
                .env("CONSUL_HTTP_ADDR", format!("http://{CONSUL_ADDR}"))
                .env("CONSUL_HTTP_TOKEN", CONSUL_TOKEN);
        }
        Ok(command)
    }

    /// Runs `block`, killing its whole process group if it outlives
    /// [`BLOCK_DEADLINE`] or if a `background` block (a node the block
    /// may be waiting for) fails meanwhile: its `until` loops would wait
    /// for that node in vain.
    pub fn run(&mut self, block: &Block) -> Result<Outcome, String> {
        let out = self.path().join(".block.out");
        let err = self.path().join(".block.err");
        let mut child = self
            .command(block, &out, &err)?
            .spawn()
            .map_err(|e| format!("bash: {e}"))?;
        let start = Instant::now();
        let mut status = None;
        let mut background_failed = false;
        while start.elapsed() < BLOCK_DEADLINE {
            if let Ok(Some(done)) = child.try_wait() {
                status = Some(done);
                break;
            }
            if !self.failed_background().is_empty() {
                background_failed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if status.is_none() {
            kill_group(&child, "KILL");
            let _ = child.wait();
        }
        let mut stderr = std::fs::read_to_string(&err).unwrap_or_default();
        if background_failed {
            stderr.push_str("\n[doc runner: killed, a background block failed meanwhile]\n");
        }
        Ok(Outcome {
            status,
            stdout: std::fs::read_to_string(&out).unwrap_or_default(),
            stderr,
        })
    }

    /// Starts a `background` block and leaves it running until the
    /// document is done; its output goes to `.background-LINE.log`.
    pub fn start_background(&mut self, block: &Block) -> Result<(), String> {
        let log = self.path().join(format!(".background-{}.log", block.line));
        let err = self.path().join(format!(".background-{}.err", block.line));
        let child = self
            .command(block, &log, &err)?
            .spawn()
            .map_err(|e| format!("bash: {e}"))?;
        self.background.push((block.line, child));
        Ok(())
    }

    /// The background blocks that have exited with a failure, each with
    /// its line and output.
    pub fn failed_background(&mut self) -> Vec<(usize, String)> {
        let mut failed = Vec::new();
        for (line, child) in &mut self.background {
            if let Ok(Some(status)) = child.try_wait() {
                if !status.success() {
                    failed.push((*line, format!("exited ({status})")));
                }
            }
        }
        failed
    }

    /// The last lines of every background block's output.
    pub fn background_logs(&self) -> String {
        let mut text = String::new();
        for (line, _) in &self.background {
            for ext in ["log", "err"] {
                let path = self.path().join(format!(".background-{line}.{ext}"));
                let log = std::fs::read_to_string(path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                if !tail.is_empty() {
                    text.push_str(&format!(
                        "--- background block of line {line} ({ext}) ---\n"
                    ));
                    for l in tail.into_iter().rev() {
                        text.push_str(l);
                        text.push('\n');
                    }
                }
            }
        }
        text
    }
}

impl Drop for DocEnv {
    fn drop(&mut self) {
        for (_, mut child) in self.background.drain(..) {
            stop_group(&mut child);
        }
        if let Some(mut node) = self.node.take() {
            stop_child(&mut node);
        }
        if let Some((runtime, consul, dc2)) = self.consul.take() {
            runtime.block_on(dc2.shutdown());
            runtime.block_on(consul.shutdown());
        }
    }
}

/// Where a document's exported variables are kept between its blocks.
const SESSION_FILE: &str = ".doc-session.env";

/// `block`'s script run as the next command of one shell session per
/// document: it starts with the variables earlier blocks exported and
/// leaves its own exports for the next block (the working directory is not
/// carried).
pub fn session_script(block: &Block, dir: &Path) -> String {
    let file = dir.join(SESSION_FILE);
    let file = file.display();
    format!(
        "if [ -f '{file}' ]; then . '{file}'; fi\n\
         trap \"export -p | grep -Ev '^declare -x (PWD|OLDPWD|SHLVL|_)=' > '{file}'\" EXIT\n{}",
        block.script()
    )
}

/// Waits for `child` up to `deadline` (polling; `None` if it still runs).
pub fn wait_bounded(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

/// SIGTERM to the process group `child` leads, a bounded wait for the
/// clean stop, then SIGKILL.
pub fn stop_group(child: &mut Child) {
    kill_group(child, "TERM");
    if wait_bounded(child, Duration::from_secs(20)).is_none() {
        kill_group(child, "KILL");
        let _ = child.wait();
    }
}

/// `signal` to the process group `child` leads.
pub fn kill_group(child: &Child, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{}", child.id())])
        .status();
}

/// SIGTERM, a bounded wait for the clean stop, then SIGKILL.
fn stop_child(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    if wait_bounded(child, Duration::from_secs(20)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Fails with a clear message when another process listens on `addr`.
fn port_free(addr: &str, what: &str) -> Result<(), String> {
    TcpListener::bind(addr).map(drop).map_err(|e| {
        format!(
            "{addr} ({what}) is taken ({e}): the doc runner serves the docs' own addresses; \
             stop whatever listens there (e.g. a dev node or Consul agent) and run again"
        )
    })
}

/// `idgen serve --config config/dev.toml` in `dir` (the README's "Two
/// commands"), once `/readyz` answers 200.
fn start_node(dir: &Path, path_var: &str) -> Result<Child, String> {
    port_free(NODE_GRPC, "the dev node's gRPC port")?;
    port_free(NODE_HTTP, "the dev node's HTTP port")?;
    let log = std::fs::File::create(dir.join("node.log")).map_err(|e| format!("node.log: {e}"))?;
    let log2 = log.try_clone().map_err(|e| format!("node.log: {e}"))?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_idgen"))
        .args(["serve", "--config", "config/dev.toml"])
        .current_dir(dir)
        .env("PATH", path_var)
        .env("NO_COLOR", "1")
        .env_remove("IDGEN_CONFIG")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(|e| format!("idgen serve: {e}"))?;
    let start = Instant::now();
    while start.elapsed() < NODE_DEADLINE {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("node.log")).unwrap_or_default();
            return Err(format!(
                "idgen serve --config config/dev.toml exited ({status}):\n{log}"
            ));
        }
        if http_status(NODE_HTTP, "/readyz") == Some(200) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_child(&mut child);
    let log = std::fs::read_to_string(dir.join("node.log")).unwrap_or_default();
    Err(format!(
        "the dev node did not answer /readyz 200 within {NODE_DEADLINE:?}:\n{log}"
    ))
}

/// The status of `GET path` on `addr`, if it answered.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// The Consul emulator on [`CONSUL_ADDR`] with ACLs on (master token
/// [`CONSUL_TOKEN`]), its second datacenter `dc2` on [`CONSUL_DC2_ADDR`],
/// and `data/idgen.token` holding that token, as consul/README.md's
/// walkthrough says to do against the test server.
fn start_consul(dir: &Path) -> Result<(tokio::runtime::Runtime, TestConsul, TestConsul), String> {
    port_free(CONSUL_ADDR, "Consul's HTTP port")?;
    port_free(CONSUL_DC2_ADDR, "the second Consul datacenter's HTTP port")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let config = Config {
        acl_master_token: Some(CONSUL_TOKEN.into()),
        ..Config::default()
    };
    let consul = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(CONSUL_ADDR).await?;
        let dc1 = TestConsul::serve(config, listener).await?;
        let listener = tokio::net::TcpListener::bind(CONSUL_DC2_ADDR).await?;
        let dc2 = dc1.serve_linked_datacenter("dc2", listener).await?;
        Ok::<_, std::io::Error>((dc1, dc2))
    });
    let (consul, dc2) = consul.map_err(|e| format!("the Consul emulator on {CONSUL_ADDR}: {e}"))?;
    let data: PathBuf = dir.join("data");
    std::fs::create_dir_all(&data).map_err(|e| format!("data/: {e}"))?;
    std::fs::write(data.join("idgen.token"), CONSUL_TOKEN)
        .map_err(|e| format!("data/idgen.token: {e}"))?;
    Ok((runtime, consul, dc2))
}
