//! The chaos run: three `idgen serve` processes in cluster mode against the
//! Consul test server, concurrent clients collecting every ID, while a
//! driver kills -9 and restarts nodes (some with the clock set back),
//! restarts nodes cleanly with the clock set back, stalls the server,
//! answers "No cluster leader", and partitions a node. Every ID collected
//! is checked: zero duplicates.
//!
//! `IDGEN_CHAOS_IDS` sets how many IDs to collect (default 5 million). The
//! larger run, outside CI:
//!
//! ```text
//! IDGEN_CHAOS_IDS=50000000 cargo test --release --test chaos -- --nocapture
//! ```

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_linearizable, write_cluster_config, Call, ChildServer};
use consul_testserver::TestConsul;
use idgen::proto::id_gen_client::IdGenClient;
use idgen::proto::{GenIdsRequest, Mode};
use tonic::transport::Channel;

const NODES: usize = 3;
const CLIENTS_PER_NODE: usize = 3;
const BATCH: u32 = 1000;
/// The run fails if the target is not reached within this long.
const LIMIT: Duration = Duration::from_secs(300);

/// One node's place: its config, agent, and the process running now.
struct Slot {
    name: String,
    agent: String,
    config: PathBuf,
    node: Mutex<Option<ChildServer>>,
    /// The gRPC address clients should use (changes on restart).
    addr: Mutex<Option<SocketAddr>>,
    /// Logs of the processes that held the slot before.
    history: Mutex<String>,
    /// Clock offset of the running process.
    offset_ms: AtomicI64,
    /// Starts with the clock behind where the stored mark (not the clock)
    /// set the start: the start-up rule at work.
    lifted: AtomicU64,
}

impl Slot {
    fn start(&self, clock_offset_ms: i64) {
        let offset = clock_offset_ms.to_string();
        let extra: Vec<&str> = if clock_offset_ms == 0 {
            vec![]
        } else {
            vec!["--test-clock-offset-ms", &offset]
        };
        // A start can fail only for want of a free worker id or Consul;
        // neither lasts in this run. Bounded retries.
        for attempt in 0..40 {
            match ChildServer::try_start(&self.config, &extra) {
                Ok(node) => {
                    self.offset_ms.store(clock_offset_ms, Ordering::Relaxed);
                    *self.addr.lock().unwrap() = Some(node.grpc);
                    *self.node.lock().unwrap() = Some(node);
                    return;
                }
                Err(log) => {
                    eprintln!(
                        "chaos: {} start attempt {attempt} failed: {}",
                        self.name,
                        log.lines().last().unwrap_or("")
                    );
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
        panic!("{} never started again", self.name);
    }

    fn take(&self) -> ChildServer {
        *self.addr.lock().unwrap() = None;
        let node = self.node.lock().unwrap().take().expect("running");
        self.keep_log(&node);
        node
    }

    fn keep_log(&self, node: &ChildServer) {
        self.record(&node.log_text());
    }

    fn record(&self, log: &str) {
        if self.offset_ms.load(Ordering::Relaxed) != 0 && started_on_the_mark(log) {
            self.lifted.fetch_add(1, Ordering::Relaxed);
        }
        let mut h = self.history.lock().unwrap();
        h.push_str(log);
        h.push('\n');
    }

    fn kill(&self) {
        self.take().kill();
    }

    fn terminate(&self) {
        *self.addr.lock().unwrap() = None;
        let node = self.node.lock().unwrap().take().expect("running");
        let log = Arc::clone(&node.log);
        let status = node.terminate();
        self.record(&log.lock().unwrap().join("\n"));
        assert!(status.success(), "{} exited with {status:?}", self.name);
    }
}

/// Calls GenIds on whichever process holds the slot, keeping every ID.
async fn client(
    slot: Arc<Slot>,
    stop: Arc<AtomicBool>,
    total: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut conn: Option<(SocketAddr, IdGenClient<Channel>)> = None;
    while !stop.load(Ordering::Relaxed) {
        let Some(addr) = *slot.addr.lock().unwrap() else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if conn.as_ref().map(|(a, _)| *a) != Some(addr) {
            let endpoint = Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_timeout(Duration::from_secs(1));
            match endpoint.connect().await {
                Ok(ch) => conn = Some((addr, IdGenClient::new(ch))),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            }
        }
        let Some((_, c)) = conn.as_mut() else {
            continue;
        };
        let call = c.gen_ids(GenIdsRequest {
            mode: Mode::Snowflake as i32,
            tag: String::new(),
            count: BATCH,
        });
        match tokio::time::timeout(Duration::from_secs(3), call).await {
            Ok(Ok(r)) => {
                let got = r.into_inner().ids;
                total.fetch_add(got.len() as u64, Ordering::Relaxed);
                ids.extend(got);
            }
            Ok(Err(status)) => {
                // UNAVAILABLE (fenced, stopping) or a dead connection.
                if status.message().contains("lost its worker lock") {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                if status.code() != tonic::Code::Unavailable {
                    conn = None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => {
                conn = None;
            }
        }
    }
    ids
}

/// What the mixed-modes clients collected.
#[derive(Default)]
struct Mixed {
    lease: Vec<u64>,
    segment: Vec<u64>,
    strict: Vec<Call>,
}

/// Calls lease, segment and strict in turn on whichever process holds the
/// slot, keeping everything (strict calls with their times).
async fn mixed_client(slot: Arc<Slot>, stop: Arc<AtomicBool>) -> Mixed {
    let mut got = Mixed::default();
    let mut conn: Option<(SocketAddr, IdGenClient<Channel>)> = None;
    let mut turn = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Some(addr) = *slot.addr.lock().unwrap() else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if conn.as_ref().map(|(a, _)| *a) != Some(addr) {
            let endpoint = Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_timeout(Duration::from_secs(1));
            match endpoint.connect().await {
                Ok(ch) => conn = Some((addr, IdGenClient::new(ch))),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            }
        }
        let Some((_, c)) = conn.as_mut() else {
            continue;
        };
        turn += 1;
        let (mode, tag, count) = match turn % 3 {
            0 => (Mode::Lease, "", 100),
            1 => (Mode::Segment, "chaos", 100),
            _ => (Mode::Strict, "chaos/k", 1 + (turn % 4) as u32),
        };
        let start = Instant::now();
        let call = c.gen_ids(GenIdsRequest {
            mode: mode as i32,
            tag: tag.into(),
            count,
        });
        match tokio::time::timeout(Duration::from_secs(3), call).await {
            Ok(Ok(r)) => {
                let end = Instant::now();
                let ids = r.into_inner().ids;
                match mode {
                    Mode::Lease => got.lease.extend(ids),
                    Mode::Segment => got.segment.extend(ids),
                    _ => got.strict.push(Call {
                        start,
                        end,
                        first: ids[0],
                        last: ids[ids.len() - 1],
                    }),
                }
            }
            Ok(Err(status)) => {
                if status.code() != tonic::Code::Unavailable {
                    conn = None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => conn = None,
        }
    }
    got
}

fn duplicates(mut ids: Vec<u64>) -> usize {
    ids.sort_unstable();
    ids.windows(2).filter(|w| w[0] == w[1]).count()
}

/// Whether the process's first generator started right above the stored
/// mark (start = stored + 1 ms) rather than at its own clock.
fn started_on_the_mark(log: &str) -> bool {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            v["fields"]["message"].as_str()
                == Some("high-water mark reserved; generator starts above every earlier ID")
        })
        .and_then(|v| {
            // A plain number (absent when nothing was stored).
            let stored = v["fields"]["stored_hwm_ms"].as_u64()?;
            Some(v["fields"]["start_ms"].as_u64()? == stored + 1)
        })
        .unwrap_or(false)
}

/// Waits until `agent` holds no session, then out lock-delay.
fn wait_out_session(consul: &TestConsul, agent: &str) {
    for _ in 0..200 {
        if consul.sessions().iter().all(|s| s.node != agent) {
            pause(Duration::from_millis(2100));
            return;
        }
        pause(Duration::from_millis(50));
    }
    panic!("the killed node's session never expired");
}

fn config(dir: &Path, name: &str, agent: SocketAddr) -> PathBuf {
    write_cluster_config(
        dir,
        name,
        agent,
        &[
            ("server", "max_wait", "\"2s\""),
            ("lease", "enabled", "true"),
            ("lease", "block", "500"),
            ("segment", "enabled", "true"),
            ("segment", "auto_create", "true"),
            ("segment", "default_step", "500"),
            ("strict", "enabled", "true"),
        ],
    )
}

/// Sleeps `d` on a blocking thread (the driver runs off the runtime).
fn pause(d: Duration) {
    std::thread::sleep(d);
}

/// One slot a node, each started on its own agent of `consul`.
async fn start_slots(consul: &TestConsul, dir: &Path) -> Vec<Arc<Slot>> {
    let mut slots = Vec::new();
    for i in 0..NODES {
        let agent = format!("agent-{}", i + 1);
        let addr = consul.add_agent(&agent).await.unwrap();
        let slot = Arc::new(Slot {
            name: format!("n{i}"),
            config: config(dir, &format!("n{i}"), addr),
            agent,
            node: Mutex::new(None),
            addr: Mutex::new(None),
            history: Mutex::new(String::new()),
            offset_ms: AtomicI64::new(0),
            lifted: AtomicU64::new(0),
        });
        slot.start(0);
        slots.push(slot);
    }
    slots
}

/// One round of the driver's faults, on nodes chosen by the round number.
fn fault_round(
    slots: &[Arc<Slot>],
    consul: &TestConsul,
    rounds: u32,
    log: &mut impl FnMut(String),
) {
    let s = &slots[rounds as usize % NODES];
    let t = &slots[(rounds as usize + 1) % NODES];
    let all_agents: Vec<String> = slots.iter().map(|s| s.agent.clone()).collect();

    log(format!("kill -9 {} and restart it at once", s.name));
    s.kill();
    s.start(0);
    pause(Duration::from_secs(2));

    log(format!(
        "restart {} cleanly with its clock 2 s behind",
        t.name
    ));
    t.terminate();
    t.start(-2000);
    pause(Duration::from_secs(2));

    log(format!(
        "kill -9 {}, wait out its session, restart it with its clock 8 s behind",
        t.name
    ));
    t.kill();
    wait_out_session(consul, &t.agent);
    t.start(-8000);
    pause(Duration::from_secs(2));

    log("stall the server: every answer 2.5 s late, for 3 s".into());
    for a in &all_agents {
        consul.faults().delay(a, Some(Duration::from_millis(2500)));
    }
    consul.faults().pause_session_expiry(true);
    pause(Duration::from_secs(3));
    consul.faults().pause_session_expiry(false);
    for a in &all_agents {
        consul.faults().delay(a, None);
    }
    pause(Duration::from_secs(2));

    log("no cluster leader for 2 s".into());
    for a in &all_agents {
        consul.faults().no_leader(a, true);
    }
    pause(Duration::from_secs(2));
    for a in &all_agents {
        consul.faults().no_leader(a, false);
    }
    pause(Duration::from_secs(2));

    log(format!("partition {} from Consul for 4 s", s.name));
    consul.faults().drop_requests(&s.agent, true);
    pause(Duration::from_secs(4));
    consul.faults().drop_requests(&s.agent, false);
    pause(Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run_issues_no_duplicate_ids() {
    let target: u64 = std::env::var("IDGEN_CHAOS_IDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000_000);
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let slots = start_slots(&consul, dir.path()).await;

    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for slot in &slots {
        for _ in 0..CLIENTS_PER_NODE {
            clients.push(tokio::spawn(client(
                Arc::clone(slot),
                Arc::clone(&stop),
                Arc::clone(&total),
                Arc::clone(&refused),
            )));
        }
    }

    let mixed: Vec<_> = slots
        .iter()
        .map(|slot| tokio::spawn(mixed_client(Arc::clone(slot), Arc::clone(&stop))))
        .collect();

    // The driver: rounds of faults until enough IDs are collected.
    let driver = {
        let slots = slots.clone();
        let consul = consul.clone();
        let total = Arc::clone(&total);
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut rounds = 0u32;
            let mut events = Vec::new();
            let mut log = |what: String| {
                eprintln!(
                    "chaos {:>6.1}s {:>10} ids: {what}",
                    started.elapsed().as_secs_f64(),
                    total.load(Ordering::Relaxed)
                );
                events.push(what);
            };
            while rounds == 0 || total.load(Ordering::Relaxed) < target {
                assert!(
                    started.elapsed() < LIMIT,
                    "only {} of {target} IDs in {LIMIT:?}",
                    total.load(Ordering::Relaxed)
                );
                fault_round(&slots, &consul, rounds, &mut log);

                rounds += 1;
                log(format!("round {rounds} done"));
            }
            (rounds, events)
        })
    };
    let driven = driver.await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for c in clients {
        all.extend(c.await.expect("client task"));
    }
    let mut modes = Mixed::default();
    for m in mixed {
        let m = m.await.expect("mixed client");
        modes.lease.extend(m.lease);
        modes.segment.extend(m.segment);
        modes.strict.extend(m.strict);
    }
    for slot in &slots {
        if slot.node.lock().unwrap().is_some() {
            slot.terminate();
        }
    }
    let (rounds, events) = driven.expect("driver");
    let collected = all.len();
    all.sort_unstable();
    let dups: Vec<u64> = all
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    eprintln!(
        "chaos: {collected} IDs, {rounds} rounds, {} fault events, {} duplicates",
        events.len(),
        dups.len()
    );
    assert!(collected as u64 >= target, "{collected} < {target}");
    // The faults bit: nodes fenced themselves, said so to callers, and
    // came back; restarts with the clock behind started above their marks.
    let history: String = slots
        .iter()
        .map(|s| s.history.lock().unwrap().clone())
        .collect();
    let fencings = history.matches("worker lock lost").count();
    let reclaims = history.matches("claimed again").count();
    let behind: u64 = slots.iter().map(|s| s.lifted.load(Ordering::Relaxed)).sum();
    eprintln!(
        "chaos: {fencings} fencings, {reclaims} re-claims, {} calls refused while fenced, {behind} starts with the clock behind lifted by the stored mark",
        refused.load(Ordering::Relaxed)
    );
    assert!(fencings >= 2 * rounds as usize, "{fencings} fencings");
    assert!(reclaims >= 2 * rounds as usize, "{reclaims} re-claims");
    assert!(refused.load(Ordering::Relaxed) > 0);
    // Both restarts with the clock behind got their id back and started
    // on the stored mark, not on their clock.
    assert!(
        behind >= 2 * u64::from(rounds),
        "{behind} starts lifted by the mark"
    );
    assert!(
        dups.is_empty(),
        "{} duplicate IDs, first {:?}",
        dups.len(),
        &dups[..dups.len().min(10)]
    );
    eprintln!(
        "chaos: other modes: {} lease IDs, {} segment IDs, {} strict calls",
        modes.lease.len(),
        modes.segment.len(),
        modes.strict.len()
    );
    assert!(!modes.lease.is_empty() && !modes.segment.is_empty() && !modes.strict.is_empty());
    assert_eq!(duplicates(modes.lease), 0, "lease IDs twice");
    assert_eq!(duplicates(modes.segment), 0, "segment IDs twice");
    assert_linearizable(&modes.strict);
    consul.shutdown().await;
}
