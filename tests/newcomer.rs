//! The newcomer's path with Consul ACLs and mutual TLS on, as written:
//! docs/CLUSTER.md, "A secure cluster end to end (ACLs and mTLS)".
//!
//! Its shell blocks run in order, verbatim but for their ports (the
//! walkthrough's 8500, 50051, 50052, 9464 and 9465 become free ones, so no
//! other process on the machine can hold them), in a temporary directory
//! that links the repository: `idgen tls dev-certs`, the config, two
//! `idgen serve` nodes (in the background), the admin calls with the
//! admin certificate, the CLI through Consul, the Python example. The
//! Consul emulator stands in for the agent of consul/README.md's steps 1
//! and 2: ACLs on (its master token in `data/idgen.token`), gRPC checks
//! over TLS trusting the walkthrough's CA and presenting its client
//! certificate (`enable_agent_tls_for_checks`). Then the Rust snippet of
//! docs/CLIENTS.md ("Client (Rust)"), which [`readme_snippet`] holds
//! verbatim (checked against that page), runs in the same directory with the same Consul
//! variables. Every mode, formatted included, must answer in all three.

#[path = "doc_commands/blocks.rs"]
#[allow(dead_code)]
mod blocks;
#[path = "doc_commands/env.rs"]
#[allow(dead_code)]
mod env;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use consul_testserver::{CheckTlsConfig, Config, TestConsul};
use env::{kill_group, session_script, stop_group, wait_bounded};

/// The page holding the walkthrough.
const WALK_DOC: &str = "docs/CLUSTER.md";
/// The walkthrough's heading in [`WALK_DOC`].
const SECTION: &str = "## A secure cluster end to end (ACLs and mTLS)";
/// The page holding the Rust snippet the walkthrough's step 8 runs.
const SNIPPET_DOC: &str = "docs/CLIENTS.md";
/// The Consul emulator's ACL master token (what `data/idgen.token` holds).
const MASTER_TOKEN: &str = "newcomer-master-token";
/// The walkthrough's fixed ports, each replaced by a free one.
const WALK_PORTS: [&str; 4] = ["50051", "50052", "9464", "9465"];
/// The walkthrough's Consul address.
const WALK_CONSUL: &str = "127.0.0.1:8500";
/// A generous bound on one block (they take seconds), not an assertion.
const BLOCK_DEADLINE: Duration = Duration::from_secs(180);
/// A generous bound for the nodes to show as passing in Consul.
const PASSING_DEADLINE: Duration = Duration::from_secs(90);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text of the section of `doc` (a page's text) headed `heading`, up
/// to the next `## `.
fn section<'a>(readme: &'a str, heading: &str) -> &'a str {
    let start = readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading:?} in {WALK_DOC} or {SNIPPET_DOC}"));
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 4);
    &rest[..end]
}

/// The Rust snippet: the one ```rust block of docs/CLIENTS.md's "Client (Rust)".
fn readme_rust_snippet(readme: &str) -> String {
    let client = section(readme, "## Client (Rust)");
    let start = client
        .find("```rust")
        .expect("a ```rust block in Client (Rust)");
    let body = &client[start..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    body[..body.find("```").expect("closing fence")].to_string()
}

/// The text between the snippet markers of [`readme_snippet`], dedented.
fn snippet_in_this_file() -> String {
    let source = include_str!("newcomer.rs");
    let begin = "    // README snippet begins\n";
    let start = source.find(begin).expect("begin marker") + begin.len();
    let end = start
        + source[start..]
            .find("    // README snippet ends\n")
            .expect("end marker");
    source[start..end]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// What the Rust snippet got, for the assertions.
struct SnippetIds {
    snowflake: u64,
    segment: u64,
    lease: u64,
    strict: u64,
    uuid: idgen_client::Uuid,
    invoices: Vec<String>,
    parsed_seq: u64,
    counter_last: u64,
}

/// docs/CLIENTS.md's Rust snippet, verbatim between the markers (the test
/// compares them), in the async fn the walkthrough's step 8 describes.
#[rustfmt::skip]
async fn readme_snippet() -> Result<SnippetIds, Box<dyn std::error::Error>> {
    // README snippet begins
    use std::time::Duration;
    use idgen_client::{Client, ConsulDiscovery, Mode, TlsConfig};

    let client = Client::builder()
        // CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN(_FILE), CONSUL_CACERT, ... (table below)
        .consul(ConsulDiscovery::from_env()?.service("idgen"))
        // or: .consul(ConsulDiscovery::new("http://127.0.0.1:8500").token("..."))
        // or: .endpoints(["10.0.0.1:50051", "10.0.0.2:50051"])
        // Nodes with [server.tls] and client_required (leave out for plaintext nodes):
        .tls(TlsConfig::from_ca_file("certs/ca.pem")?
            .identity_files("certs/client.pem", "certs/client-key.pem")?)
        .deadline(Duration::from_secs(3))
        .build()
        .await?;
    let id = client.gen_id(Mode::Snowflake, "").await?;        // one call to a node
    let ids = client.prefetcher(Mode::Segment, "orders")?;     // keep this handle
    let order = ids.next_id().await?;                          // from memory
    let lease = client.gen_id(Mode::Lease, "").await?;         // clock-free
    let seat = client.gen_id(Mode::Strict, "flights/lh400").await?; // always a node
    let uuid = client.gen_uuid().await?;                       // UUIDv7 (UUID.md)
    // Formatted IDs of a stored format, with its parameters (never prefetched):
    let invoices = client.gen_formatted("invoices", [("shop", "EU")], 3).await?;
    let fields = client.parse_formatted("invoices", &invoices.ids[0]).await?;
    let counter = client.format_counter("invoices", [("shop", "EU")]).await?;
    // README snippet ends
    Ok(SnippetIds {
        snowflake: id,
        segment: order,
        lease,
        strict: seat,
        uuid,
        invoices: invoices.ids,
        parsed_seq: fields.seq,
        counter_last: counter.last,
    })
}

/// `count` distinct ports nothing listens on right now, below the
/// kernel's ephemeral range where it can tell (`ip_local_port_range`).
///
/// The walkthrough binds them seconds later, after other blocks ran. A
/// port from the ephemeral range (what binding port 0 gives) can be taken
/// meanwhile as the source port of any outgoing connection on the machine,
/// and the node then fails with "Address already in use"; ports below the
/// range are never handed out that way. Ports given once are not given
/// again in this process (the tests run in parallel).
fn free_ports(count: usize) -> Vec<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some((lo, hi)) = below_ephemeral() else {
        return ephemeral_ports(count);
    };
    let mut rng = fastrand::Rng::new();
    let mut held = Vec::new();
    for _ in 0..10_000 {
        if held.len() == count {
            break;
        }
        let port = rng.u16(lo..hi);
        if given.contains(&port) {
            continue;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            given.push(port);
            held.push(l);
        }
    }
    assert_eq!(held.len(), count, "no {count} free ports in {lo}..{hi}");
    held.iter()
        .map(|l| l.local_addr().expect("a free port").port())
        .collect()
}

/// Up to 10,000 ports just below the ephemeral range, if it is known and
/// leaves room below it.
fn below_ephemeral() -> Option<(u16, u16)> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = range.split_whitespace().next()?.parse().ok()?;
    (low >= 3024).then(|| (low.saturating_sub(10_000).max(2048), low))
}

/// `count` distinct ports from the kernel (port 0), all held until all are
/// chosen so it cannot hand one out twice.
fn ephemeral_ports(count: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a free port").port())
        .collect()
}

/// Python with the client installed from its wheel (the virtualenv
/// `scripts/setup.sh` makes), if any.
fn python_venv() -> Option<PathBuf> {
    let bin = std::env::temp_dir().join("idgen-client-venv/bin");
    let ok = Command::new(bin.join("python"))
        .args(["-c", "import idgen_client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(bin)
}

/// The walkthrough's directory, processes and Consul.
struct Walk {
    dir: tempfile::TempDir,
    /// walkthrough port -> the free port used instead (placeholders first, so a
    /// free port containing a walkthrough port is never replaced again).
    ports: Vec<(String, String)>,
    venv: Option<PathBuf>,
    background: Vec<(usize, Child)>,
    consul: Option<(tokio::runtime::Runtime, TestConsul)>,
}

impl Walk {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        for entry in std::fs::read_dir(repo()).expect("repo").flatten() {
            let name = entry.file_name();
            let skip = ["target", "data", ".git", "certs", "gen"];
            if !skip.contains(&name.to_string_lossy().as_ref()) {
                std::os::unix::fs::symlink(entry.path(), dir.path().join(&name)).expect("link");
            }
        }
        std::fs::create_dir(dir.path().join("bin")).expect("bin");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_idgen"), dir.path().join("bin/idgen"))
            .expect("link idgen");
        let ports = WALK_PORTS
            .iter()
            .zip(free_ports(WALK_PORTS.len()))
            .map(|(from, to)| (from.to_string(), to.to_string()))
            .collect();
        Self {
            dir,
            ports,
            venv: python_venv(),
            background: Vec::new(),
            consul: None,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn consul_addr(&self) -> SocketAddr {
        self.consul.as_ref().expect("consul started").1.addr()
    }

    /// `script` with the walkthrough's addresses replaced by this walk's.
    fn localize(&self, script: &str) -> String {
        let mut text = script.replace(WALK_CONSUL, "\u{1}consul\u{1}");
        for (i, (from, _)) in self.ports.iter().enumerate() {
            text = text.replace(from.as_str(), &format!("\u{1}{i}\u{1}"));
        }
        if let Some((_, consul)) = &self.consul {
            text = text.replace("\u{1}consul\u{1}", &consul.addr().to_string());
        }
        for (i, (_, to)) in self.ports.iter().enumerate() {
            text = text.replace(&format!("\u{1}{i}\u{1}"), to);
        }
        assert!(!text.contains('\u{1}'), "an address left unmapped:\n{text}");
        text
    }

    /// The Consul emulator with ACLs and TLS checks that trust the
    /// walkthrough's CA and present its client certificate; its master
    /// token in `data/idgen.token` (consul/README.md's steps 1 and 2).
    fn start_consul(&mut self) {
        let certs = self.path().join("certs");
        let read = |name: &str| {
            std::fs::read(certs.join(name))
                .unwrap_or_else(|e| panic!("certs/{name} (written by step 2): {e}"))
        };
        let config = Config {
            acl_master_token: Some(MASTER_TOKEN.into()),
            check_tls: CheckTlsConfig {
                ca_pem: Some(read("ca.pem")),
                client_pem: Some((read("client.pem"), read("client-key.pem"))),
            },
            ..Config::default()
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let consul = runtime
            .block_on(TestConsul::start(config))
            .expect("the Consul emulator");
        std::fs::create_dir_all(self.path().join("data")).expect("data/");
        std::fs::write(self.path().join("data/idgen.token"), MASTER_TOKEN).expect("token");
        self.consul = Some((runtime, consul));
    }

    /// `bash -euo pipefail` running `block` (its addresses localized) in
    /// the walk's directory, in one shell session per walk (exports carry
    /// to the next block), as the doc runner runs a document.
    fn command(&self, block: &blocks::Block, out: &Path, err: &Path) -> Command {
        use std::os::unix::process::CommandExt as _;
        let local = blocks::Block {
            text: self.localize(&block.text),
            ..block.clone()
        };
        let full = session_script(&local, self.path());
        let mut path = vec![self.path().join("bin")];
        path.extend(self.venv.clone());
        let mut path = std::env::join_paths(path)
            .expect("PATH")
            .to_string_lossy()
            .into_owned();
        if let Ok(rest) = std::env::var("PATH") {
            path = format!("{path}:{rest}");
        }
        let mut command = Command::new("bash");
        command
            .args(["-euo", "pipefail", "-c", &full])
            .current_dir(self.path())
            .env("PATH", path)
            .env("NO_COLOR", "1")
            .env_remove("IDGEN_CONFIG")
            .env_remove("CONSUL_HTTP_ADDR")
            .env_remove("CONSUL_HTTP_TOKEN")
            .env_remove("CONSUL_HTTP_TOKEN_FILE")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out).expect("out"))
            .stderr(std::fs::File::create(err).expect("err"))
            .process_group(0);
        command
    }

    /// Runs `block` to its end (killed past [`BLOCK_DEADLINE`]).
    fn run(&mut self, block: &blocks::Block) -> (Option<ExitStatus>, String, String) {
        let (out, err) = (self.path().join(".out"), self.path().join(".err"));
        let mut child = self.command(block, &out, &err).spawn().expect("bash");
        let status = wait_bounded(&mut child, BLOCK_DEADLINE);
        if status.is_none() {
            kill_group(&child, "KILL");
            let _ = child.wait();
        }
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        (status, read(&out), read(&err))
    }

    /// Starts a node block and leaves it running until the walk ends.
    fn start_background(&mut self, block: &blocks::Block) {
        let out = self.path().join(format!(".node-{}.log", block.line));
        let err = self.path().join(format!(".node-{}.err", block.line));
        let child = self.command(block, &out, &err).spawn().expect("bash");
        self.background.push((block.line, child));
    }

    /// The nodes' logs, for a failure message.
    fn node_logs(&self) -> String {
        let mut text = String::new();
        for (line, _) in &self.background {
            for ext in ["log", "err"] {
                let log = std::fs::read_to_string(self.path().join(format!(".node-{line}.{ext}")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                text.push_str(&format!(
                    "--- node of {WALK_DOC} block {line} ({ext}) ---\n"
                ));
                for l in tail.into_iter().rev() {
                    text.push_str(l);
                    text.push('\n');
                }
            }
        }
        text
    }

    /// Waits (bounded) until `count` idgen services pass in Consul.
    fn wait_passing(&mut self, count: usize) {
        let start = Instant::now();
        let mut seen = 0;
        while start.elapsed() < PASSING_DEADLINE {
            seen = passing_services(self.consul_addr());
            if seen >= count {
                return;
            }
            let exited = self
                .background
                .iter_mut()
                .find_map(|(line, child)| Some((*line, child.try_wait().ok()??)));
            if let Some((line, status)) = exited {
                panic!(
                    "the node of {WALK_DOC} block {line} exited ({status}):\n{}",
                    self.node_logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "{seen} of {count} nodes passing in Consul after {PASSING_DEADLINE:?}:\n{}",
            self.node_logs()
        );
    }
}

impl Drop for Walk {
    fn drop(&mut self) {
        for (_, mut child) in self.background.drain(..) {
            stop_group(&mut child);
        }
        if let Some((runtime, consul)) = self.consul.take() {
            runtime.block_on(consul.shutdown());
        }
    }
}

/// How many `idgen` services pass in the Consul at `addr` (0 on any error).
fn passing_services(addr: SocketAddr) -> usize {
    let get = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            stream,
            "GET /v1/health/service/idgen?passing HTTP/1.0\r\nHost: {addr}\r\n\
             X-Consul-Token: {MASTER_TOKEN}\r\n\r\n"
        )?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    };
    let Ok(text) = get() else { return 0 };
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str::<Vec<serde_json::Value>>(body).map_or(0, |v| v.len())
}

/// The CLI block printed an ID for each mode and formatted IDs.
fn check_cli_output(script: &str, out: &str) {
    let gens = script
        .lines()
        .filter(|l| l.trim_start().starts_with("idgen gen "))
        .count();
    assert!(gens >= 5, "the CLI step asks every mode: {script}");
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= gens, "one line per ID at least:\n{out}");
    assert!(
        lines.iter().any(|l| l.starts_with("INV-EU-")),
        "formatted IDs from the CLI:\n{out}"
    );
}

/// The Python example's JSON line: three distinct IDs of every `--mode`,
/// distinct formatted IDs.
fn check_python_output(out: &str) {
    let line = out.lines().last().unwrap_or_default();
    let summary: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("JSON from Python ({e}):\n{out}"));
    let modes = summary["modes"].as_object().expect("modes in the summary");
    for mode in ["segment:orders", "lease", "strict:flights/lh400"] {
        let ids = modes[mode].as_array().expect("IDs of the mode");
        assert_eq!(ids.len(), 3, "{mode}: {out}");
    }
    assert_eq!(summary["ids"], summary["distinct"], "{out}");
    assert!(summary["formatted"].as_u64().unwrap_or(0) > 0, "{out}");
    assert_eq!(summary["formatted"], summary["formatted_distinct"], "{out}");
}

/// Runs the walkthrough's shell blocks in order; returns the walk (nodes
/// still running) for the Rust step.
fn run_shell_steps(walk: &mut Walk, readme: &str) {
    let text = section(readme, SECTION);
    // Lines before the section, so failures name the page's own lines.
    let before = readme[..text.as_ptr() as usize - readme.as_ptr() as usize]
        .lines()
        .count();
    let steps = blocks::shell_blocks(text).expect("well-formed blocks");
    assert!(steps.len() >= 6, "the walkthrough's blocks: {steps:?}");
    let mut pending_nodes = 0;
    for block in &steps {
        if walk.consul.is_none() && block.text.contains(WALK_CONSUL) {
            walk.start_consul();
        }
        if block.text.contains("idgen serve") {
            walk.start_background(block);
            pending_nodes += 1;
            continue;
        }
        if pending_nodes > 0 {
            walk.wait_passing(pending_nodes);
            pending_nodes = 0;
        }
        if block.text.contains("python") && walk.venv.is_none() {
            assert!(
                std::env::var_os("REQUIRE_PYTHON_EXAMPLE").is_none(),
                "REQUIRE_PYTHON_EXAMPLE is set but no Python with idgen_client: run scripts/setup.sh"
            );
            eprintln!(
                "no Python with idgen_client (run scripts/setup.sh): {WALK_DOC} block {} was not run",
                block.line
            );
            continue;
        }
        let (status, out, err) = walk.run(block);
        assert!(
            status.is_some_and(|s| s.success()),
            "{WALK_DOC}:{} failed ({status:?}):\n{}\n--- stdout ---\n{out}\n--- stderr ---\n{err}\n{}",
            before + block.line,
            walk.localize(&block.script()),
            walk.node_logs()
        );
        if block.text.contains("idgen gen --discover") {
            check_cli_output(&block.text, &out);
        }
        if block.text.contains("python -m idgen_client") {
            check_python_output(&out);
        }
    }
    assert!(walk.consul.is_some() && walk.background.len() >= 2);
}

#[test]
fn the_secure_walkthrough_gets_every_mode_over_acls_and_mtls_in_cli_python_and_rust() {
    let read = |doc: &str| {
        std::fs::read_to_string(repo().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"))
    };
    assert_eq!(
        snippet_in_this_file(),
        readme_rust_snippet(&read(SNIPPET_DOC)),
        "readme_snippet in tests/newcomer.rs must be {SNIPPET_DOC}'s Rust snippet verbatim"
    );
    let mut walk = Walk::new();
    run_shell_steps(&mut walk, &read(WALK_DOC));

    // Step 8: the Rust snippet, in the walk's directory with the
    // walkthrough's Consul variables (this test binary's only test that
    // touches the environment or the working directory).
    std::env::set_current_dir(walk.path()).expect("cd");
    std::env::set_var("CONSUL_HTTP_ADDR", walk.consul_addr().to_string());
    std::env::set_var("CONSUL_HTTP_TOKEN", MASTER_TOKEN);
    std::env::remove_var("CONSUL_HTTP_TOKEN_FILE");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let got = runtime
        .block_on(readme_snippet())
        .unwrap_or_else(|e| panic!("{SNIPPET_DOC}'s Rust snippet: {e}\n{}", walk.node_logs()));
    std::env::set_current_dir(repo()).expect("cd back");
    assert!(got.snowflake > 0 && got.lease > 0);
    assert!(got.segment >= 1, "segment {}", got.segment);
    // The CLI took the key's first strict value before: Rust's comes after.
    assert!(got.strict > 1, "strict {}", got.strict);
    assert_eq!(got.uuid.0[6] >> 4, 7, "a version 7 UUID: {}", got.uuid);
    assert_eq!(got.invoices.len(), 3);
    let distinct: std::collections::BTreeSet<&String> = got.invoices.iter().collect();
    assert_eq!(distinct.len(), 3, "{:?}", got.invoices);
    assert!(got.invoices.iter().all(|i| i.starts_with("INV-EU-")));
    assert!(got.parsed_seq > 0 && got.counter_last >= got.parsed_seq);
}
