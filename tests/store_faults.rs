//! A full disk under the embedded state file: the node refuses (UNAVAILABLE,
//! `/readyz` 503, NOT_SERVING), `/healthz` fails once the fault outlasts
//! `store.max_unhealthy`, and when space is freed the node reopens the file
//! and issues again by itself, without repeating an ID in any mode.
//!
//! The state file lives on a small tmpfs mounted by the test and a filler
//! file fills it, so the fault is a real ENOSPC from the kernel. Mounting
//! needs root (CAP_SYS_ADMIN); where it fails, the test uses the test-only
//! hook `idgen::store::fault_hook::DISK_FULL` instead (every state-file
//! write fails with ENOSPC while it is set) and prints which it used.
//! `IDGEN_TEST_FAULT=hook` forces the hook.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{metric, TestServer};
use idgen::config::Config;
use idgen::proto::id_gen_client::IdGenClient;
use idgen::proto::{GenIdsRequest, Mode};
use idgen::store::fault_hook::DISK_FULL;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// Size of the tmpfs the state file lives on.
const TMPFS_SIZE: &str = "8m";
/// The limit before `/healthz` fails, short for the test.
const MAX_UNHEALTHY: Duration = Duration::from_secs(2);
/// Upper bound on any wait for the node to change state.
const PATIENCE: Duration = Duration::from_secs(30);

/// A tmpfs mounted on a fresh temporary directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: the node may still hold the state file open.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// How the disk is made full: a real tmpfs and a filler file, or the
/// test-only hook.
enum FullDisk {
    Tmpfs { fs: Tmpfs, filler: Option<PathBuf> },
    Hook { dir: tempfile::TempDir },
}

impl FullDisk {
    fn new() -> Self {
        let forced = std::env::var("IDGEN_TEST_FAULT").is_ok_and(|v| v == "hook");
        let mounted = if forced {
            Err("IDGEN_TEST_FAULT=hook".to_owned())
        } else {
            Tmpfs::mount(TMPFS_SIZE)
        };
        match mounted {
            Ok(fs) => {
                eprintln!("fault: real ENOSPC, a {TMPFS_SIZE} tmpfs filled by a filler file");
                Self::Tmpfs { fs, filler: None }
            }
            Err(e) => {
                eprintln!(
                    "fault: no tmpfs ({}); using the test-only hook idgen::store::fault_hook::DISK_FULL",
                    e.trim()
                );
                Self::Hook {
                    dir: tempfile::tempdir().unwrap(),
                }
            }
        }
    }

    fn dir(&self) -> &Path {
        match self {
            Self::Tmpfs { fs, .. } => fs.path(),
            Self::Hook { dir } => dir.path(),
        }
    }

    fn fill(&mut self) {
        match self {
            Self::Tmpfs { fs, filler } => *filler = Some(fill(fs.path())),
            Self::Hook { .. } => DISK_FULL.store(true, Ordering::SeqCst),
        }
    }

    fn free(&mut self) {
        match self {
            Self::Tmpfs { filler, .. } => {
                if let Some(path) = filler.take() {
                    std::fs::remove_file(path).unwrap();
                }
            }
            Self::Hook { .. } => DISK_FULL.store(false, Ordering::SeqCst),
        }
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        DISK_FULL.store(false, Ordering::SeqCst);
    }
}

/// Fills the filesystem of `dir` with one file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler file");
    let chunk = vec![0xa5u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
        assert!(written < 1 << 30, "the tmpfs does not fill up");
    }
    // Single bytes into the last partial page.
    while f.write(&[0]).is_ok_and(|n| n == 1) {}
    let _ = f.sync_all();
    path
}

fn libc_enospc() -> i32 {
    28
}

fn config(dir: &Path) -> Config {
    let mut c = common::all_modes_config(dir);
    // Short high-water-mark window, so snowflake runs out soon after the
    // store stops confirming marks.
    c.hwm.renew_interval = Duration::from_millis(100);
    c.hwm.reserve = Duration::from_millis(500);
    c.store.max_unhealthy = MAX_UNHEALTHY;
    c
}

const SEGMENT_TAG: &str = "orders";
const STRICT_KEY: &str = "chat/room1";

fn request(mode: Mode, tag: &str, count: u32) -> GenIdsRequest {
    GenIdsRequest {
        mode: mode as i32,
        tag: tag.into(),
        count,
    }
}

/// Everything handed out, per mode.
#[derive(Default)]
struct Issued {
    snowflake: Vec<u64>,
    segment: Vec<u64>,
    lease: Vec<u64>,
    strict: Vec<u64>,
}

impl Issued {
    fn list(&mut self, mode: Mode) -> &mut Vec<u64> {
        match mode {
            Mode::Snowflake => &mut self.snowflake,
            Mode::Segment => &mut self.segment,
            Mode::Lease => &mut self.lease,
            Mode::Strict => &mut self.strict,
            other => panic!("not tested here: {other:?}"),
        }
    }
}

const MODES: [(Mode, &str, u32); 4] = [
    (Mode::Snowflake, "", 100),
    (Mode::Segment, SEGMENT_TAG, 30),
    (Mode::Lease, "", 30),
    (Mode::Strict, STRICT_KEY, 5),
];

/// One call per mode; every one must succeed.
async fn issue_all(c: &mut IdGenClient<Channel>, issued: &mut Issued) {
    for (mode, tag, count) in MODES {
        let ids = c
            .gen_ids(request(mode, tag, count))
            .await
            .unwrap_or_else(|e| panic!("{mode:?} issues: {e}"))
            .into_inner()
            .ids;
        assert_eq!(ids.len(), count as usize, "{mode:?}");
        issued.list(mode).extend(ids);
    }
}

/// Calls `mode` until it refuses (keeping what it got before); the
/// refusal must be UNAVAILABLE and say the store cannot be written.
async fn call_until_refused(
    c: &mut IdGenClient<Channel>,
    mode: Mode,
    tag: &str,
    count: u32,
    issued: &mut Issued,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match c.gen_ids(request(mode, tag, count)).await {
            Ok(r) => issued.list(mode).extend(r.into_inner().ids),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::Unavailable, "{mode:?}: {e:?}");
                let msg = e.message();
                let why = if mode == Mode::Snowflake {
                    msg.contains("high-water mark") && msg.contains("not confirming writes")
                } else {
                    msg.contains("cannot be written") || msg.contains("write failed")
                };
                assert!(why, "{mode:?}: says why: {msg}");
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{mode:?} still issues {PATIENCE:?} after the disk filled up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn status(url: &str) -> u16 {
    reqwest::get(url).await.unwrap().status().as_u16()
}

/// Polls `url` until it answers `want`, at most [`PATIENCE`].
async fn wait_status(url: &str, want: u16) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if status(url).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn metrics_text(server: &TestServer) -> String {
    reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn assert_distinct(name: &str, ids: &[u64]) {
    let mut seen = HashSet::new();
    for id in ids {
        assert!(seen.insert(*id), "{name}: ID {id} handed out twice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_issuing_and_freeing_space_resumes_without_repeats() {
    let mut disk = FullDisk::new();
    let server = TestServer::start(config(disk.dir())).await;
    let mut c = server.client().await;
    let mut issued = Issued::default();
    issue_all(&mut c, &mut issued).await;
    assert!(wait_status(&server.url("/readyz"), 200).await);
    assert_eq!(status(&server.url("/healthz")).await, 200);

    // Disk full: strict calls on new keys need fresh pages in the state
    // file until one commit fails with ENOSPC.
    disk.fill();
    let long = "k".repeat(120);
    // Values given to the fill keys; the last one that got values and the
    // one whose commit failed are used again after the fault.
    let mut fill_keys: Vec<(String, Vec<u64>)> = Vec::new();
    let mut refused = false;
    for i in 0..50_000u32 {
        let key = format!("fill/{long}{i}");
        match c.gen_ids(request(Mode::Strict, &key, 1)).await {
            Ok(r) => fill_keys.push((key, r.into_inner().ids)),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
                fill_keys.push((key, Vec::new()));
                refused = true;
                break;
            }
        }
    }
    assert!(refused, "strict writes kept succeeding on a full disk");
    let again: Vec<(String, Vec<u64>)> = fill_keys.into_iter().rev().take(2).collect();

    // Every mode refuses once what it had reserved is used up; strict at once.
    let e = c
        .gen_ids(request(Mode::Strict, STRICT_KEY, 1))
        .await
        .expect_err("strict needs a commit per call");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains("cannot be written") || e.message().contains("write failed"),
        "{e:?}"
    );
    for (mode, tag, count) in MODES {
        call_until_refused(&mut c, mode, tag, count, &mut issued).await;
    }
    assert_eq!(status(&server.url("/readyz")).await, 503);
    assert_eq!(
        common::grpc_health(server.grpc).await,
        ServingStatus::NotServing
    );
    let text = metrics_text(&server).await;
    assert_eq!(metric(&text, "idgen_store_healthy"), Some(0.0), "{text}");
    assert!(metric(&text, "idgen_store_write_faults_total").unwrap_or(0.0) >= 1.0);

    // The fault outlasts store.max_unhealthy: liveness fails too.
    assert!(
        wait_status(&server.url("/healthz"), 503).await,
        "/healthz must fail once the store has been unwritable for longer than {MAX_UNHEALTHY:?}"
    );
    let text = metrics_text(&server).await;
    assert!(
        metric(&text, "idgen_unable_to_issue_seconds").unwrap_or(0.0)
            >= MAX_UNHEALTHY.as_secs_f64(),
        "{text}"
    );

    // Free the space: the node reopens the file and serves by itself.
    disk.free();
    assert!(
        wait_status(&server.url("/readyz"), 200).await,
        "the node must resume by itself once space is free"
    );
    assert_eq!(status(&server.url("/healthz")).await, 200);
    assert_eq!(
        common::grpc_health(server.grpc).await,
        ServingStatus::Serving
    );
    let text = metrics_text(&server).await;
    assert_eq!(metric(&text, "idgen_store_healthy"), Some(1.0), "{text}");
    assert!(
        text.contains("idgen_store_reopens_total{result=\"ok\"}"),
        "a successful reopen is counted: {text}"
    );

    // The key whose write failed continues as if that write had happened
    // or not; either way no value repeats (nor on the key before it).
    for (key, mut values) in again {
        for _ in 0..3 {
            let r = c
                .gen_ids(request(Mode::Strict, &key, 2))
                .await
                .unwrap_or_else(|e| panic!("strict on {key} after the fault: {e}"));
            values.extend(r.into_inner().ids);
        }
        assert!(
            values.windows(2).all(|w| w[0] < w[1]),
            "values of {key} strictly increase across the fault: {values:?}"
        );
    }
    let strict_before = issued.strict.len();
    for _ in 0..3 {
        issue_all(&mut c, &mut issued).await;
    }
    assert!(issued.strict.len() > strict_before);

    assert_distinct("snowflake", &issued.snowflake);
    assert_distinct("segment", &issued.segment);
    assert_distinct("lease", &issued.lease);
    assert!(
        issued.strict.windows(2).all(|w| w[0] < w[1]),
        "strict values of one key strictly increase across the fault: {:?}",
        issued.strict
    );
    server.stop().await;
}

/// Cluster mode: a node cut off from Consul fences itself (NOT_SERVING at
/// once); fenced for longer than `store.max_unhealthy` its `/healthz`
/// fails too, and it recovers by itself once Consul answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_fenced_longer_than_max_unhealthy_fails_healthz_and_recovers() {
    use common::{write_cluster_config, ChildServer};
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config {
        min_ttl: Duration::from_secs(1),
        ttl_expiry_factor: 1.0,
        min_deregister_critical_after: Duration::from_secs(1),
        ..consul_testserver::Config::default()
    })
    .await
    .expect("test consul");
    let agent = consul.add_agent("agent-h").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_cluster_config(
        dir.path(),
        "h",
        agent,
        &[("store", "max_unhealthy", "\"1s\"")],
    );
    let node = ChildServer::start(&config);
    let url = |path: &str| format!("http://{}{path}", node.http);
    let mut c = node.client().await;
    let mut seen = HashSet::new();
    let first = c
        .gen_ids(request(Mode::Snowflake, "", 100))
        .await
        .expect("issues")
        .into_inner()
        .ids;
    seen.extend(first);
    assert_eq!(status(&url("/healthz")).await, 200);

    consul.faults().drop_requests("agent-h", true);
    assert!(wait_status(&url("/readyz"), 503).await, "fenced: not ready");
    assert!(
        wait_status(&url("/healthz"), 503).await,
        "/healthz must fail once fenced for longer than store.max_unhealthy"
    );
    let text = reqwest::get(url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metric(&text, "idgen_unable_to_issue_seconds").unwrap_or(0.0) >= 1.0);
    assert_eq!(metric(&text, "idgen_fenced"), Some(1.0), "{text}");

    consul.faults().drop_requests("agent-h", false);
    assert!(wait_status(&url("/readyz"), 200).await, "claims again");
    assert_eq!(status(&url("/healthz")).await, 200);
    let after = c
        .gen_ids(request(Mode::Snowflake, "", 100))
        .await
        .expect("issues again")
        .into_inner()
        .ids;
    for id in after {
        assert!(seen.insert(id), "ID {id} handed out twice");
    }
    assert!(node.log_text().contains("store.max_unhealthy"));
    assert!(node.terminate().success());
}

/// A deleted state file stops the node for good, but never fails
/// `/healthz`: a restart behind the operator's back could start on a file
/// someone put at the path since. The operator restores and restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_state_file_does_not_fail_healthz() {
    // A child process: its metrics are its own, not this test binary's.
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text = text.replace("[store]\n", "[store]\nmax_unhealthy = \"1s\"\n");
    std::fs::write(&config, text).unwrap();
    let node = common::ChildServer::start(&config);
    let url = |p: &str| format!("http://{}{p}", node.http);
    assert!(wait_status(&url("/readyz"), 200).await);
    let path = dir.path().join("state.redb");
    std::fs::remove_file(&path).unwrap();
    assert!(wait_status(&url("/readyz"), 503).await);
    tokio::time::sleep(3 * Duration::from_secs(1)).await;
    assert_eq!(status(&url("/healthz")).await, 200);
    let text = reqwest::get(url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(metric(&text, "idgen_state_file_lost"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "idgen_unable_to_issue_seconds"), Some(0.0));
    assert!(!path.exists());
    node.kill();
}
