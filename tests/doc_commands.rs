//! Docs that cannot drift: every shell block of the user-facing documents
//! runs against real processes, and every metric name they (and the
//! alerts and the dashboard) write is one idgen declares.
//!
//! The rules for writing blocks (the markers, what a `console` block
//! compares) are in docs/CONTRIBUTING.md, "Docs are tested". Documents run
//! one after another (the development node and the Consul emulator listen
//! on the docs' own fixed loopback addresses); every block of every
//! document runs and the test then fails once, listing each failed block
//! with its document, line, command and output.

mod doc_commands {
    pub mod blocks;
    pub mod env;
}

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use doc_commands::blocks::{shell_blocks, Block};
use doc_commands::env::DocEnv;

/// The documents outside docs/ whose shell blocks run (every docs/*.md
/// runs as well).
const DOCUMENTS: [&str; 3] = [
    "README.md",
    "consul/README.md",
    "deploy/kubernetes/README.md",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and friends, then every docs/*.md, as paths from the root.
fn documents() -> Vec<String> {
    let mut docs: Vec<String> = DOCUMENTS.iter().map(|d| d.to_string()).collect();
    for doc in &docs {
        assert!(
            repo().join(doc).is_file(),
            "{doc} is gone: update DOCUMENTS"
        );
    }
    let mut in_docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// Why `block` failed, in full: where, what ran, what it printed.
fn failure(doc: &str, block: &Block, why: &str, out: &str, err: &str, env: &DocEnv) -> String {
    let mut text = format!(
        "{doc}:{}: ```{} block {why}\n--- commands (bash -euo pipefail, in a temp dir) ---\n{}\
         --- stdout ---\n{out}\n--- stderr ---\n{err}\n",
        block.line,
        block.lang,
        block.script()
    );
    text.push_str(&env.background_logs());
    if let Some(log) = env.node_log() {
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        text.push_str("--- dev node log (last lines) ---\n");
        for line in tail.into_iter().rev() {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// Runs every block of `doc`; returns the failures and how many blocks ran.
fn run_document(doc: &str) -> (Vec<String>, usize) {
    let text = std::fs::read_to_string(repo().join(doc)).expect("document");
    let blocks = match shell_blocks(&text) {
        Ok(blocks) => blocks,
        Err(e) => return (vec![format!("{doc}: {e}")], 0),
    };
    let runnable: Vec<&Block> = blocks.iter().filter(|b| b.marker.skip.is_none()).collect();
    if runnable.is_empty() {
        return (Vec::new(), 0);
    }
    let mut env = match DocEnv::new(&repo()) {
        Ok(env) => env,
        Err(e) => return (vec![format!("{doc}: {e}")], 0),
    };
    let mut failures = Vec::new();
    for block in &runnable {
        if let Err(e) = env.prepare(block) {
            failures.push(format!(
                "{doc}:{}: cannot start what the block needs: {e}",
                block.line
            ));
            continue;
        }
        if block.marker.background {
            if let Err(e) = env.start_background(block) {
                failures.push(format!("{doc}:{}: cannot start the block: {e}", block.line));
            }
            continue;
        }
        let outcome = match env.run(block) {
            Ok(outcome) => outcome,
            Err(e) => {
                failures.push(format!("{doc}:{}: cannot run the block: {e}", block.line));
                continue;
            }
        };
        let why = match (outcome.status, block.marker.expect_fail) {
            (None, _) => Some(
                "was killed (at the deadline, or because a background block failed: see stderr)"
                    .to_string(),
            ),
            (Some(s), false) if !s.success() => Some(format!("failed ({s})")),
            (Some(s), true) if s.success() => {
                Some("succeeded, but its marker says expect-fail".to_string())
            }
            _ => None,
        };
        if let Some(why) = why {
            failures.push(failure(
                doc,
                block,
                &why,
                &outcome.stdout,
                &outcome.stderr,
                &env,
            ));
        }
    }
    for (line, why) in env.failed_background() {
        failures.push(format!(
            "{doc}:{line}: background block {why}\n{}",
            env.background_logs()
        ));
    }
    (failures, runnable.len())
}

/// How many times a document runs when a port it serves on was taken.
const PORT_ATTEMPTS: usize = 3;

/// The loopback ports the docs serve on: the development node's, the
/// Consul walkthrough's three nodes', the README tour's three nodes' and
/// the Consul agents' (two datacenters).
const DOC_PORTS: [u16; 14] = [
    50051, 50052, 50053, 9464, 9465, 9466, 50061, 50062, 50063, 9471, 9472, 9473, 8500, 8510,
];

/// How long an attempt waits for its ports to become free: longer than
/// Linux's TIME_WAIT (60 s, fixed in the kernel).
const PORT_WAIT: Duration = Duration::from_secs(75);

/// Whether a failure is a port the docs serve on being held by something
/// else on the machine. The docs' gRPC ports (50051-50053) lie in Linux's
/// ephemeral range, so an outgoing connection (a `curl` of an earlier
/// block, one of the document's own nodes talking to Consul) can take one.
/// Once such a connection closes, its port stays in TIME_WAIT for 60 s,
/// and no listener can bind it meanwhile, SO_REUSEADDR or not.
fn port_taken(failure: &str) -> bool {
    failure.contains("Address already in use") || failure.contains(") is taken (")
}

/// The [`DOC_PORTS`] `text` names as `127.0.0.1:<port>`.
fn doc_ports(text: &str) -> Vec<u16> {
    DOC_PORTS
        .into_iter()
        .filter(|port| text.contains(&format!("127.0.0.1:{port}")))
        .collect()
}

/// Waits, at most `limit`, until every port of `ports` can be listened on;
/// returns those still taken then, each with what `ss` says holds it.
fn wait_for_free(ports: &[u16], limit: Duration) -> Vec<String> {
    let start = Instant::now();
    loop {
        let taken: Vec<u16> = ports
            .iter()
            .copied()
            .filter(|port| TcpListener::bind(("127.0.0.1", *port)).is_err())
            .collect();
        if taken.is_empty() || start.elapsed() >= limit {
            return taken.iter().map(|port| holder(*port)).collect();
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `port` with the sockets `ss` lists on it (for the failure message).
fn holder(port: u16) -> String {
    let filter = format!("sport = :{port}");
    let ss = Command::new("ss").args(["-tanp", &filter]).output();
    match ss {
        Ok(out) => format!("{port}:\n{}", String::from_utf8_lossy(&out.stdout)),
        Err(e) => format!("{port} (ss: {e})"),
    }
}

/// [`run_document`], each attempt once the document's ports are free (or
/// after [`PORT_WAIT`]), run again in a fresh environment (at most
/// [`PORT_ATTEMPTS`] times in all) while a failure is only a taken port:
/// a document that itself serves twice on one port fails every attempt.
fn run_document_retrying(doc: &str) -> (Vec<String>, usize) {
    let text = std::fs::read_to_string(repo().join(doc)).expect("document");
    let ports = doc_ports(&text);
    let mut attempt = 1;
    loop {
        let taken = wait_for_free(&ports, PORT_WAIT);
        if !taken.is_empty() {
            eprintln!(
                "{doc}: ports still taken after {PORT_WAIT:?}:\n{}",
                taken.join("\n")
            );
        }
        let (failures, ran) = run_document(doc);
        if attempt == PORT_ATTEMPTS || !failures.iter().any(|f| port_taken(f)) {
            return (failures, ran);
        }
        eprintln!("{doc}: a port it serves on was taken; running it again (attempt {attempt})");
        attempt += 1;
    }
}

#[test]
fn every_shell_block_in_the_docs_runs_as_written() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for doc in documents() {
        let (mut failed, count) = run_document_retrying(&doc);
        failures.append(&mut failed);
        ran += count;
    }
    assert!(
        ran >= 10,
        "only {ran} blocks ran: is the runner finding them?"
    );
    assert!(
        failures.is_empty(),
        "{} doc block(s) failed; fix the command, or mark the block \
         (docs/CONTRIBUTING.md, \"Docs are tested\"):\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A checkout that has `gen/` and `data/` of its own (`/gen` is what
/// docs/CLIENTS.md's stubs block makes when a reader runs it, and is
/// git-ignored): a block writing there writes into the temporary
/// directory, never through a link into the checkout.
#[test]
fn blocks_write_stubs_and_data_in_the_temp_dir_not_the_checkout() {
    let checkout = tempfile::tempdir().expect("fake checkout");
    for dir in ["proto", "gen", "data"] {
        std::fs::create_dir(checkout.path().join(dir)).expect("dir");
    }
    let mut env = DocEnv::new(checkout.path()).expect("environment");
    let block = Block {
        line: 1,
        lang: "sh".into(),
        text: "ls proto\nmkdir -p gen/go data\ntouch gen/go/idgen.pb.go data/node.db\n".into(),
        marker: Default::default(),
    };
    let outcome = env.run(&block).expect("run");
    assert!(
        outcome.status.is_some_and(|s| s.success()),
        "{}",
        outcome.stderr
    );
    assert!(env.path().join("gen/go/idgen.pb.go").is_file());
    for dir in ["gen", "data"] {
        let left: Vec<_> = std::fs::read_dir(checkout.path().join(dir))
            .expect("checkout dir")
            .collect();
        assert!(
            left.is_empty(),
            "the block wrote into the checkout's {dir}/"
        );
    }
}

#[test]
fn every_document_has_only_well_formed_markers() {
    for doc in documents() {
        let text = std::fs::read_to_string(repo().join(&doc)).expect("document");
        if let Err(e) = shell_blocks(&text) {
            panic!("{doc}: {e}");
        }
    }
}

/// Every `idgen_...` token of `text` that is not a Rust path (`idgen_client::`),
/// a file name or module path (`idgen_client.py`, `idgen_grpc.pb.go`: a dot
/// then a letter or digit, which no metric name is followed by), a bare
/// prefix (`idgen_client_...`) or the Python client's package name
/// (`idgen_client`, `python -m idgen_client`): the client's metrics all
/// start `idgen_client_`.
fn metric_tokens(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
    let mut tokens = BTreeSet::new();
    for (start, _) in text.match_indices("idgen_") {
        if start > 0 && (word(bytes[start - 1]) || bytes[start - 1] == b'-') {
            continue;
        }
        let end = start + bytes[start..].iter().take_while(|&&b| word(b)).count();
        let rest = &text[end..];
        let prefix_only = text[start..end].ends_with('_');
        let package = &text[start..end] == "idgen_client";
        let dotted =
            rest.starts_with('.') && rest[1..].starts_with(|c: char| c.is_ascii_alphanumeric());
        if prefix_only || package || dotted || rest.starts_with("::") {
            continue;
        }
        tokens.insert(text[start..end].to_string());
    }
    tokens
}

/// The metric names declared as string constants in `file`.
fn declared_names(file: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).expect("metrics source");
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("idgen_")
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
        .map(str::to_string)
        .collect()
}

/// The files whose metric names must all be declared.
fn metric_sources() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = documents().iter().map(|d| repo().join(d)).collect();
    for (dir, ext) in [("deploy/prometheus", "yml"), ("deploy/grafana", "json")] {
        for entry in std::fs::read_dir(repo().join(dir))
            .expect("deploy dir")
            .flatten()
        {
            if entry.path().extension().is_some_and(|e| e == ext) {
                files.push(entry.path());
            }
        }
    }
    files
}

/// `name` is declared, or is a declared histogram's `_bucket`, `_sum` or
/// `_count` series.
fn is_declared(name: &str, declared: &BTreeSet<String>) -> bool {
    declared.contains(name)
        || ["_bucket", "_sum", "_count"].iter().any(|s| {
            name.strip_suffix(s)
                .is_some_and(|base| declared.contains(base))
        })
}

#[test]
fn every_metric_name_in_docs_alerts_and_dashboard_is_declared() {
    let mut declared = declared_names(&repo().join("src/metrics.rs"));
    assert!(
        declared.len() > 40,
        "too few names parsed from src/metrics.rs: {declared:?}"
    );
    // The client crate's own metrics (docs/CLIENTS.md, "Client (Rust)").
    declared.extend(declared_names(&repo().join("client/src/metrics.rs")));
    let mut unknown = Vec::new();
    for file in metric_sources() {
        let text = std::fs::read_to_string(&file).expect("source");
        for token in metric_tokens(&text) {
            if !is_declared(&token, &declared) {
                let shown = file
                    .strip_prefix(repo())
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                unknown.push(format!("{shown}: {token}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metric names that src/metrics.rs (or client/src/metrics.rs) does not declare; \
         fix the name or declare the metric:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn metric_tokens_skip_paths_and_files_and_keep_suffixes() {
    let text = "`idgen_fenced` idgen_client::Client idgen_client.py my_idgen_x idgen_... \
                rate(idgen_request_duration_seconds_bucket[5m]) idgen-py-venv \
                python -m idgen_client idgen_client.metrics idgen_client_calls_total \
                gen/go/idgen/v1/idgen_grpc.pb.go counts idgen_ids_issued_total.";
    let tokens: Vec<String> = metric_tokens(text).into_iter().collect();
    assert_eq!(
        tokens,
        [
            "idgen_client_calls_total",
            "idgen_fenced",
            "idgen_ids_issued_total",
            "idgen_request_duration_seconds_bucket"
        ]
    );
    let declared: BTreeSet<String> = ["idgen_request_duration_seconds".to_string()].into();
    assert!(is_declared(
        "idgen_request_duration_seconds_bucket",
        &declared
    ));
    assert!(!is_declared(
        "idgen_request_duration_seconds_total",
        &declared
    ));
}

#[test]
fn only_a_taken_port_runs_a_document_again() {
    let ci = "error: cannot listen on server.grpc_listen 127.0.0.1:50052: Address already in use (os error 98)";
    assert!(port_taken(ci));
    assert!(port_taken(
        "127.0.0.1:9464 (the dev node's HTTP port) is taken (Address in use): stop it"
    ));
    assert!(!port_taken(
        "failed (exit status: 1)\nerror: unknown format"
    ));
}

#[test]
fn the_ports_a_document_serves_on_are_waited_for_and_time_wait_is_named() {
    let text = "idgen gen --addr http://127.0.0.1:50052 -n 5\ncurl 127.0.0.1:8500/v1/kv";
    assert_eq!(doc_ports(text), [50052, 8500]);
    // A listener that goes away within the wait: the wait ends free.
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(listener);
    });
    let taken = wait_for_free(&[port], Duration::from_secs(30));
    assert!(taken.is_empty(), "{taken:?}");
    closer.join().expect("closer");
    // A client connection that closed first leaves its port in TIME_WAIT
    // for 60 s, and no listener can bind it meanwhile (CI once lost all
    // three attempts of consul/README.md to 50052 held so): the wait
    // names the port and what holds it.
    let server = TcpListener::bind("127.0.0.1:0").expect("server");
    let client = std::net::TcpStream::connect(server.local_addr().expect("addr")).expect("connect");
    let port = client.local_addr().expect("client addr").port();
    let (accepted, _) = server.accept().expect("accept");
    drop(client);
    std::thread::sleep(Duration::from_millis(100));
    drop(accepted);
    let taken = wait_for_free(&[port], Duration::from_millis(300));
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert!(taken[0].starts_with(&format!("{port}:")), "{taken:?}");
}
