//! UUIDv7 end to end: every UUID valid (version 7, variant 10), strictly
//! increasing per node in byte order, carrying the node's datacenter and
//! worker; across kill -9 and restarts, through clock steps back, on two
//! nodes at once, and never from a fenced node. The bit layout's own
//! rules are unit-tested in `src/id/uuid.rs` and
//! `src/id/snowflake/uuids.rs`.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{run_idgen, start_node, test_config, write_child_config, ChildServer, TestServer};
use idgen::id::{Clock, ManualClock, SystemClock, Uuid, UuidLayout};
use idgen::proto::{DecodeUuidRequest, GenUuidRequest, GenUuidsRequest};

fn layout() -> UuidLayout {
    UuidLayout::of(&common::default_layout()).expect("the default layout serves UUIDs")
}

async fn uuids(
    c: &mut idgen::proto::id_gen_client::IdGenClient<tonic::transport::Channel>,
    n: u32,
) -> Vec<Uuid> {
    let r = c
        .gen_uuids(GenUuidsRequest {
            count: n,
            with_text: false,
        })
        .await
        .expect("GenUuids")
        .into_inner();
    assert_eq!(r.uuids.len(), n as usize * 16);
    r.uuids
        .chunks_exact(16)
        .map(|b| Uuid::from_bytes(b.try_into().expect("16 bytes")))
        .collect()
}

/// Chi-square of the random bits' low byte over 256 buckets: with 255
/// degrees of freedom, above 400 happens by chance about once in 10^8.
fn chi_square_of_low_random_byte(sample: &[Uuid]) -> f64 {
    let l = layout();
    let mut buckets = [0u64; 256];
    for u in sample {
        let p = l.decompose(*u).expect("version 7");
        buckets[(p.random & 0xff) as usize] += 1;
    }
    let expected = sample.len() as f64 / 256.0;
    buckets
        .iter()
        .map(|&n| (n as f64 - expected).powi(2) / expected)
        .sum()
}

/// 10 M UUIDs from one node: every one version 7 and variant 10, with the
/// node's datacenter and worker, strictly increasing in byte order (so no
/// two equal), and random bits that pass a chi-square test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_million_uuids_are_valid_increasing_and_random() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let mut c = server.client().await;
    let l = layout();
    let mut last = Uuid(0);
    let mut sample = Vec::with_capacity(100_000);
    for call in 0..1_000 {
        for u in uuids(&mut c, 10_000).await {
            assert_eq!((u.version(), u.variant()), (7, 0b10), "{u}");
            assert!(u > last, "{u} after {last}");
            assert!(u.to_bytes() > last.to_bytes());
            last = u;
            if call % 100 == 0 {
                sample.push(u);
            }
        }
    }
    let p = l.decompose(last).expect("decodes");
    assert_eq!((p.datacenter, p.worker), (0, 0));
    let chi = chi_square_of_low_random_byte(&sample);
    assert!(chi < 400.0, "random bits fail chi-square: {chi:.1}");
    server.stop().await;
}

/// The gRPC single call, HTTP (text and ULID), DecodeUuid and the CLI
/// (`idgen gen --uuid`, `--ulid`, `idgen decode`) agree with each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_interface_gives_and_reads_the_same_uuids() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_child_config(dir.path(), true);
    let server = ChildServer::start(&config);
    let mut c = server.client().await;
    let one = c.gen_uuid(GenUuidRequest {}).await.unwrap().into_inner();
    let u = Uuid::from_bytes(one.uuid.as_slice().try_into().unwrap());
    assert_eq!(one.text, u.to_string());

    let http = reqwest::Client::new();
    let body: serde_json::Value = http
        .get(format!(
            "http://{}/v1/uuids?count=3&format=ulid",
            server.http
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ulids: Vec<Uuid> = body["uuids"]
        .as_array()
        .expect("uuids")
        .iter()
        .map(|t| Uuid::parse(t.as_str().unwrap()).expect("ULID text"))
        .collect();
    assert!(ulids[0] > u && ulids.windows(2).all(|w| w[0] < w[1]));
    let single: serde_json::Value = http
        .get(format!("http://{}/v1/uuid", server.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = single["uuid"].as_str().expect("uuid text").to_owned();
    assert_eq!(text.len(), 36);

    let decoded = c
        .decode_uuid(DecodeUuidRequest {
            text: ulids[1].to_ulid(),
            uuid: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decoded.uuid, ulids[1].to_string());
    let parts = layout().decompose(ulids[1]).unwrap();
    assert_eq!(
        (decoded.unix_millis, decoded.counter),
        (parts.unix_ms, parts.counter)
    );
    let now = SystemClock.now_millis();
    assert!(decoded.unix_millis <= now + 5_000 && decoded.unix_millis + 60_000 > now);

    let addr = server.grpc.to_string();
    let (ok, out) = run_idgen(&["gen", "--uuid", "-n", "5", "--addr", &addr]);
    assert!(ok, "{out}");
    let printed: Vec<Uuid> = out
        .lines()
        .map(|l| Uuid::parse(l).expect("UUID lines"))
        .collect();
    assert_eq!(printed.len(), 5);
    assert!(printed[0].to_string() > text && printed.windows(2).all(|w| w[0] < w[1]));
    let (ok, out) = run_idgen(&["gen", "--ulid", "-n", "2", "--addr", &addr]);
    assert!(ok && out.lines().all(|l| l.len() == 26), "{out}");
    let (ok, out) = run_idgen(&["decode", &printed[0].to_string(), "--addr", &addr]);
    assert!(
        ok && out.contains("worker 0") && out.contains("ulid "),
        "{out}"
    );
    let (ok, out) = run_idgen(&["decode", &printed[0].to_ulid(), "--json"]);
    assert!(ok && out.contains("\"counter\""), "{out}");
    server.kill();
}

/// kill -9 without any shutdown, three times over on one state file:
/// every UUID after a restart is above every UUID before it.
#[tokio::test]
async fn kill_9_and_restart_uuids_only_go_up() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_child_config(dir.path(), true);
    let mut highest = Uuid(0);
    for round in 0..3 {
        let server = ChildServer::start(&config);
        let mut c = server.client().await;
        let got = uuids(&mut c, 10_000).await;
        server.kill();
        assert!(got[0] > highest, "round {round}: {} <= {highest}", got[0]);
        highest = *got.last().unwrap();
    }
}

/// An embedded node in `dir` with worker id `worker` (its config path).
fn node_config(dir: &std::path::Path, worker: u64) -> std::path::PathBuf {
    let path = write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&path).expect("config written");
    text.push_str(&format!("[node]\nworker_id = {worker}\n"));
    std::fs::write(&path, text).expect("config written");
    path
}

/// `n` UUIDs from the client's UUID prefetch buffer, as `idgen::id::Uuid`.
async fn next_uuids(client: &idgen_client::Client, n: usize) -> Vec<Uuid> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let u = client.next_uuid().await.expect("next_uuid");
        out.push(Uuid::from_bytes(u.0));
    }
    out
}

/// The client's UUID prefetch (`next_uuid`) over two nodes, with small
/// batches (so dozens of refills) and node 1 killed -9 halfway: every UUID
/// handed out is valid and unique, those of each node come out strictly
/// increasing (one refill in flight, so batches arrive in issue order),
/// and node 1 restarted on its state file issues only greater ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_uuid_across_refills_and_a_kill_9_is_unique_and_increasing_per_node() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a_config, b_config) = (node_config(a_dir.path(), 1), node_config(b_dir.path(), 2));
    let (a, b) = (ChildServer::start(&a_config), ChildServer::start(&b_config));
    let prefetch = idgen_client::PrefetchConfig {
        initial_batch: 64,
        min_batch: 16,
        max_batch: 256,
        refills_in_flight: 1,
        ..idgen_client::PrefetchConfig::default()
    };
    let client = |nodes: Vec<String>| {
        idgen_client::Client::builder()
            .endpoints(nodes)
            .deadline(std::time::Duration::from_secs(10))
            .prefetch(prefetch.clone())
            .build()
    };
    let c = client(vec![a.grpc.to_string(), b.grpc.to_string()])
        .await
        .expect("client");
    let mut handed = next_uuids(&c, 5_000).await;
    a.kill();
    handed.extend(next_uuids(&c, 5_000).await);
    drop(c);

    let mut seen = HashSet::new();
    let mut last = [Uuid(0); 3];
    for u in &handed {
        assert_eq!((u.version(), u.variant()), (7, 0b10), "{u}");
        assert!(seen.insert(*u), "{u} handed out twice");
        let worker = layout().decompose(*u).expect("decodes").worker as usize;
        assert!(worker == 1 || worker == 2, "{u} from worker {worker}");
        assert!(
            *u > last[worker],
            "worker {worker}: {u} after {}",
            last[worker]
        );
        last[worker] = *u;
    }
    assert!(last[2] > Uuid(0), "node 2 served none after node 1 died");

    let a = ChildServer::start(&a_config);
    let c = client(vec![a.grpc.to_string()]).await.expect("client");
    for u in next_uuids(&c, 1_000).await {
        assert!(u > last[1], "node 1 after kill -9: {u} <= {}", last[1]);
        assert!(seen.insert(u), "{u} handed out twice");
    }
    drop(c);
    a.kill();
    b.kill();
}

/// A hand-driven clock: a step back within clock.max_backward keeps UUIDs
/// increasing (the logical millisecond carries on); a larger one refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_back_keeps_uuids_increasing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::at_millis(SystemClock.now_millis()));
    let node = start_node(test_config(dir.path()), clock.clone()).await;
    let issuer = Arc::clone(&node.issuer);
    let mut last = Uuid(0);
    let mut check = |batch: Vec<Uuid>| {
        for u in batch {
            assert!(u > last, "{u} after {last}");
            last = u;
        }
    };
    check(issuer.gen_uuids(1000).await.unwrap());
    clock.advance_millis(1500);
    check(issuer.gen_uuids(1000).await.unwrap());
    clock.step_back_millis(500);
    check(issuer.gen_uuids(1000).await.unwrap());
    check(vec![issuer.gen_uuid().await.unwrap()]);
    clock.step_back_millis(2000);
    let refused = issuer
        .gen_uuids(1)
        .await
        .expect_err("2.5 s back is refused");
    assert!(refused.to_string().contains("stepped back"), "{refused}");
    let refused = issuer.gen_uuid().await.expect_err("2.5 s back is refused");
    assert!(refused.to_string().contains("stepped back"), "{refused}");
    clock.advance_millis(2600);
    check(vec![issuer.gen_uuid().await.unwrap()]);
    check(issuer.gen_uuids(1000).await.unwrap());
    drop(issuer);
    node.stop().await;
}

/// Two nodes (worker 1 and 2) issuing at once: their UUIDs never collide,
/// whatever their clocks and counters, since the node field differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_never_share_a_uuid_and_a_fenced_node_issues_none() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = |dir: &std::path::Path, worker: u64| {
        let mut c = test_config(dir);
        c.node.worker_id = worker;
        c
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let a = start_node(config(a_dir.path(), 1), Arc::clone(&clock)).await;
    let b = start_node(config(b_dir.path(), 2), clock).await;
    let (ia, ib) = (Arc::clone(&a.issuer), Arc::clone(&b.issuer));
    let ta = tokio::spawn(async move {
        let mut all = Vec::new();
        for _ in 0..100 {
            all.extend(ia.gen_uuids(10_000).await.unwrap());
        }
        all
    });
    let mut seen: HashSet<Uuid> = HashSet::new();
    for _ in 0..100 {
        for u in ib.gen_uuids(10_000).await.unwrap() {
            assert!(seen.insert(u));
            assert_eq!(layout().decompose(u).unwrap().worker, 2);
        }
    }
    for u in ta.await.unwrap() {
        assert!(seen.insert(u), "{u} from both nodes");
        assert_eq!(layout().decompose(u).unwrap().worker, 1);
    }
    assert_eq!(seen.len(), 2_000_000);

    b.issuer.gate().fence();
    let refused = b.issuer.gen_uuids(1).await.expect_err("fenced");
    assert_eq!(
        refused.kind(),
        idgen::id::ErrorKind::Unavailable,
        "{refused}"
    );
    let refused = b.issuer.gen_uuid().await.expect_err("fenced");
    assert_eq!(
        refused.kind(),
        idgen::id::ErrorKind::Unavailable,
        "{refused}"
    );
    a.stop().await;
    b.stop_within(std::time::Duration::from_secs(10)).await;
}

/// Bad input: each refusal INVALID_ARGUMENT naming the problem.
#[tokio::test]
async fn bad_counts_and_text_are_invalid_arguments_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let mut c = server.client().await;
    for count in [0, 10_001] {
        let s = c
            .gen_uuids(GenUuidsRequest {
                count,
                with_text: false,
            })
            .await
            .expect_err("refused");
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains("count"), "{}", s.message());
    }
    for (text, says) in [
        ("not-a-uuid", "is not a UUID"),
        ("f47ac10b-58cc-4372-a567-0e02b2c3d479", "version 4"),
        ("8ZZZZZZZZZZZZZZZZZZZZZZZZZ", "over 128 bits"),
        ("017f22e2-79b0-7cc3-18c4-dc0c0c07398f", "variant bits"),
    ] {
        let s = c
            .decode_uuid(DecodeUuidRequest {
                text: text.into(),
                uuid: Vec::new(),
            })
            .await
            .expect_err(text);
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{text}: {s:?}");
        assert!(s.message().contains(says), "{text}: {}", s.message());
    }
    let s = c
        .decode_uuid(DecodeUuidRequest {
            text: String::new(),
            uuid: vec![0; 15],
        })
        .await
        .expect_err("15 bytes");
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    let bad = reqwest::get(server.url("/v1/uuids?count=5&format=base64"))
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("format=ulid"));
    server.stop().await;
}

/// ULID and UUID text agree with python-ulid (an independent
/// implementation, from PyPI via scripts/setup.sh): the same 128 bits both
/// ways. Required where the test command runs (`REQUIRE_PYTHON_EXAMPLE`).
#[tokio::test]
async fn ulid_text_matches_an_independent_implementation() {
    let python = std::env::var_os("IDGEN_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("idgen-py-venv/bin/python"));
    let has_ulid = std::process::Command::new(&python)
        .args(["-c", "import ulid"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_ulid {
        assert!(
            std::env::var_os("REQUIRE_PYTHON_EXAMPLE").is_none(),
            "REQUIRE_PYTHON_EXAMPLE is set but {} has no python-ulid: run scripts/setup.sh",
            python.display()
        );
        eprintln!("no Python with python-ulid (run scripts/setup.sh): not checked");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let mut c = server.client().await;
    let mut sample = uuids(&mut c, 50).await;
    sample.push(Uuid(u128::MAX >> 2));
    sample.push(Uuid(0));
    let lines: Vec<String> = sample
        .iter()
        .map(|u| format!("{} {}", u, u.to_ulid()))
        .collect();
    let script = "import sys, uuid\nfrom ulid import ULID\nfor line in sys.stdin:\n    text, ulid = line.split()\n    assert str(ULID.from_uuid(uuid.UUID(text))) == ulid, (text, ulid)\n    assert str(ULID.from_str(ulid).to_uuid()) == text, (text, ulid)\nprint('ok', end='')\n";
    let mut child = std::process::Command::new(&python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(lines.join("\n").as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("python ends");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok",
        "python-ulid disagrees: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.stop().await;
}
