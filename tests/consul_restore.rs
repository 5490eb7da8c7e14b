//! A Consul snapshot restore rolls every counter back. Three nodes issue
//! from segment, strict, lease and a formatted format; the snapshot is
//! saved, they issue more, it is restored. No node may hand out anything
//! twice: each refuses (UNAVAILABLE naming the key) where it reads a
//! counter below what it wrote, `idgen admin skip-ahead --margin N`
//! moves the cluster on, and they resume above everything issued before.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{write_cluster_config, Running as Started};
use consul_testserver::TestConsul;
use idgen::config::{Config, Overrides};
use idgen::id::{Clock, ErrorKind, Mode, SystemClock};

const TAG: &str = "orders";
const STRICT_KEY: &str = "books/b1";
const FORMAT: &str = "daily";
const TOKEN: &str = "restore-admin-secret";

const FORMATS: &str = r#"
[[formats]]
name = "daily"
template = "{yyyy}{MM}{dd}{seq:9}"
reset = "day"
"#;

/// An in-process node on the system clock.
async fn start(config: Config) -> Started {
    common::start_node(config, Arc::new(SystemClock)).await
}

/// Every ID and value handed out, per mode, and the errors seen.
#[derive(Default)]
struct Seen {
    segment: HashSet<u64>,
    lease: HashSet<u64>,
    strict: Vec<u64>,
    formatted: HashSet<String>,
    /// (mode, kind, message) of each refusal.
    errors: Vec<(&'static str, ErrorKind, String)>,
}

impl Seen {
    fn numbers(&mut self, mode: &'static str, ids: Vec<u64>) {
        for id in ids {
            let set = match mode {
                "segment" => &mut self.segment,
                _ => &mut self.lease,
            };
            assert!(set.insert(id), "{mode} ID {id} handed out twice");
        }
    }

    fn strict_values(&mut self, values: Vec<u64>) {
        for v in values {
            if let Some(last) = self.strict.last() {
                assert!(v > *last, "strict value {v} not above {last}: repeated");
            }
            self.strict.push(v);
        }
    }

    /// One call of every mode on `node`; returns how many modes issued.
    async fn round(&mut self, node: &Started, count: u64) -> usize {
        let mut issued = 0;
        for (mode, name, tag) in [
            (Mode::Segment, "segment", TAG),
            (Mode::Lease, "lease", ""),
            (Mode::Strict, "strict", STRICT_KEY),
        ] {
            match node.issuer.gen_ids(mode, tag, count).await {
                Ok(ids) if name == "strict" => {
                    self.strict_values(ids);
                    issued += 1;
                }
                Ok(ids) => {
                    self.numbers(name, ids);
                    issued += 1;
                }
                Err(e) => self.errors.push((name, e.kind(), e.to_string())),
            }
        }
        match node.issuer.gen_formatted(FORMAT, &[], count).await {
            Ok(out) => {
                for id in out.ids {
                    assert!(
                        self.formatted.insert(id.text.clone()),
                        "formatted ID {} handed out twice",
                        id.text
                    );
                }
                issued += 1;
            }
            Err(e) => self.errors.push(("formatted", e.kind(), e.to_string())),
        }
        issued
    }
}

async fn snapshot(consul: &consul_testserver::TestConsul) -> Vec<u8> {
    let r = reqwest::get(format!("http://{}/v1/snapshot", consul.addr()))
        .await
        .expect("snapshot save");
    assert_eq!(r.status().as_u16(), 200);
    r.bytes().await.expect("archive").to_vec()
}

async fn restore(consul: &consul_testserver::TestConsul, archive: Vec<u8>) {
    let r = reqwest::Client::new()
        .put(format!("http://{}/v1/snapshot", consul.addr()))
        .body(archive)
        .send()
        .await
        .expect("snapshot restore");
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
}

/// Three nodes issuing from every counter mode and the formatted format.
async fn start_three(consul: &TestConsul, dir: &Path) -> Vec<Started> {
    let mut nodes = Vec::new();
    for i in 0..3 {
        let path = write_cluster_config(
            dir,
            &format!("n{i}"),
            consul.addr(),
            &[
                ("segment", "enabled", "true"),
                ("segment", "auto_create", "true"),
                ("segment", "default_step", "10"),
                ("segment", "max_step", "10"),
                ("lease", "enabled", "true"),
                ("lease", "block", "10"),
                ("strict", "enabled", "true"),
                ("formatted", "block", "3"),
                ("admin", "token", &format!("\"{TOKEN}\"")),
            ],
        );
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(FORMATS);
        std::fs::write(&path, text).unwrap();
        let config = Config::load(Some(&path), &Overrides::default(), SystemClock.now_millis())
            .expect("cluster config");
        nodes.push(start(config).await);
    }
    nodes
}

/// Runs `idgen admin skip-ahead --margin 1000 --json` against `node`;
/// asserts it succeeded and returns what it printed.
async fn skip_ahead_cli(node: &Started) -> String {
    let addr = format!("http://{}", node.grpc);
    let (ok, out) = tokio::task::spawn_blocking(move || {
        common::run_idgen(&[
            "admin",
            "--addr",
            &addr,
            "--token",
            TOKEN,
            "--json",
            "skip-ahead",
            "--margin",
            "1000",
        ])
    })
    .await
    .unwrap();
    assert!(ok, "skip-ahead: {out}");
    out
}

/// `idgen admin skip-ahead` through `node`: every kind of counter moved,
/// one run recorded.
async fn skip_ahead_through(node: &Started) {
    let out = skip_ahead_cli(node).await;
    let r: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let n = |f: &str| r[f].as_u64().unwrap_or(0);
    assert!(
        n("segments") >= 1
            && n("strict") >= 1
            && n("lease_tokens") >= 3
            && n("format_counters") >= 1,
        "{r}"
    );
    assert!(n("marks") >= 3, "{r}");
    assert_eq!(n("runs"), 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_consul_snapshot_is_refused_until_a_skip_ahead_and_nothing_repeats() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_three(&consul, dir.path()).await;

    let mut seen = Seen::default();
    for _ in 0..4 {
        for node in &nodes {
            assert_eq!(seen.round(node, 5).await, 4, "{:?}", seen.errors);
        }
    }
    let archive = snapshot(&consul).await;
    // Every node writes every counter after the snapshot: more than a
    // range, a block and a formatted block each.
    for _ in 0..6 {
        for node in &nodes {
            assert_eq!(seen.round(node, 5).await, 4, "{:?}", seen.errors);
        }
    }
    restore(&consul, archive).await;

    // Nodes serve what they still hold in memory, then refuse: never a
    // repeat (Seen asserts it on every call).
    for _ in 0..40 {
        for node in &nodes {
            seen.round(node, 5).await;
        }
        let refused: HashSet<&str> = seen.errors.iter().map(|(m, _, _)| *m).collect();
        if refused.len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (mode, key) in [
        ("segment", format!("segments/{TAG}")),
        ("strict", format!("strict/{STRICT_KEY}")),
        ("lease", "lease/0/".to_owned()),
        ("formatted", format!("formats/{FORMAT}")),
    ] {
        let named = seen.errors.iter().any(|(m, kind, text)| {
            *m == mode
                && *kind == ErrorKind::Unavailable
                && text.contains(&key)
                && text.contains("idgen admin skip-ahead")
        });
        assert!(
            named,
            "{mode}: no UNAVAILABLE naming {key} and the skip-ahead: {:?}",
            seen.errors
        );
    }

    skip_ahead_through(&nodes[0]).await;

    // Every node resumes by itself, above everything issued before.
    let (max_segment, max_strict) = (
        seen.segment.iter().max().copied().unwrap_or(0),
        seen.strict.last().copied().unwrap_or(0),
    );
    for node in &nodes {
        let mut resumed = false;
        for _ in 0..100 {
            seen.errors.clear();
            if seen.round(node, 5).await == 4 {
                resumed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(resumed, "a node did not resume: {:?}", seen.errors);
    }
    // Snowflake too: a node fenced by its rolled-back mark claims again
    // once the mark is above its own write.
    for node in &nodes {
        let mut last = None;
        for _ in 0..100 {
            match node.issuer.gen_ids(Mode::Snowflake, "", 1).await {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(last.is_none(), "snowflake did not resume: {last:?}");
    }
    let new_segment = seen.segment.iter().max().copied().unwrap_or(0);
    assert!(
        new_segment > max_segment + 900,
        "{new_segment} vs {max_segment}"
    );
    let new_strict = seen.strict.last().copied().unwrap_or(0);
    assert!(
        new_strict > max_strict + 900,
        "{new_strict} vs {max_strict}"
    );

    // Run again, from the command line straight against Consul (no node
    // in between): everything moves a second time, and nodes keep going.
    let config = dir.path().join("n0.toml");
    let (ok, out) = tokio::task::spawn_blocking(move || {
        let config = config.to_string_lossy().into_owned();
        common::run_idgen(&[
            "admin",
            "--json",
            "skip-ahead",
            "--margin",
            "1000",
            "--config",
            &config,
        ])
    })
    .await
    .unwrap();
    assert!(ok, "offline skip-ahead: {out}");
    assert!(out.contains("\"runs\":2"), "{out}");
    let before = seen.strict.last().copied().unwrap_or(0);
    for node in &nodes {
        let mut issued = false;
        for _ in 0..100 {
            seen.errors.clear();
            if seen.round(node, 5).await == 4 {
                issued = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            issued,
            "a node stopped after the second run: {:?}",
            seen.errors
        );
    }
    let after = seen.strict.last().copied().unwrap_or(0);
    assert!(after > before + 900, "{after} vs {before}");

    for node in nodes {
        node.stop_within(Duration::from_secs(20)).await;
    }
}

/// A node that did not write a counter after the snapshot still may not
/// take from it after the restore: node A's cached segment ModifyIndex
/// dates from before the snapshot, B takes ranges after it, the restore
/// makes A's cached index current again. Every counter txn also checks
/// A's own mark at the index of its last write, which the restore moved
/// back, so A's compare-and-set fails and the re-read mark is below A's
/// write: refused, and nothing of B's repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_cached_index_from_before_the_snapshot_does_not_repeat_other_nodes_ranges() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for name in ["a", "b"] {
        let path = write_cluster_config(
            dir.path(),
            name,
            consul.addr(),
            &[
                ("segment", "enabled", "true"),
                ("segment", "auto_create", "true"),
                ("segment", "default_step", "10"),
                ("segment", "max_step", "10"),
                ("strict", "enabled", "true"),
            ],
        );
        let config = Config::load(Some(&path), &Overrides::default(), SystemClock.now_millis())
            .expect("cluster config");
        nodes.push(start(config).await);
    }
    let (a, b) = (&nodes[0], &nodes[1]);
    let strict = |node: &Started| {
        let issuer = Arc::clone(&node.issuer);
        async move { issuer.gen_ids(Mode::Strict, STRICT_KEY, 3).await }
    };
    let mut seen = Seen::default();
    let ids = b.issuer.gen_ids(Mode::Segment, TAG, 5).await.expect("b");
    seen.numbers("segment", ids);
    let ids = a.issuer.gen_ids(Mode::Segment, TAG, 5).await.expect("a");
    seen.numbers("segment", ids);
    seen.strict_values(strict(b).await.expect("b strict"));
    seen.strict_values(strict(a).await.expect("a strict"));
    // Let any prefetch land before the snapshot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let archive = snapshot(&consul).await;
    // A renews its mark (every second) after the snapshot, and issues
    // nothing; B takes several ranges.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for _ in 0..10 {
        let ids = b.issuer.gen_ids(Mode::Segment, TAG, 5).await.expect("b");
        seen.numbers("segment", ids);
        seen.strict_values(strict(b).await.expect("b strict"));
    }
    restore(&consul, archive).await;

    // A strict key is read fresh on every call, and the restored value is
    // above what A wrote: only the mark check tells A the store went back.
    let err = strict(a).await.map(|v| seen.strict_values(v)).err();
    let text = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        text.contains("idgen admin skip-ahead"),
        "strict on A: {text:?}"
    );

    // A serves what it holds, then must refuse rather than take a range
    // from the restored record (Seen asserts no repeat on every call).
    let mut refusal = None;
    for _ in 0..20 {
        match a.issuer.gen_ids(Mode::Segment, TAG, 5).await {
            Ok(ids) => seen.numbers("segment", ids),
            Err(e) => {
                refusal = Some((e.kind(), e.to_string()));
                break;
            }
        }
    }
    let (kind, text) = refusal.expect("node A never refused after the restore");
    assert_eq!(kind, ErrorKind::Unavailable, "{text}");
    assert!(text.contains("idgen admin skip-ahead"), "{text}");

    for node in nodes {
        node.stop_within(Duration::from_secs(20)).await;
    }
}

/// The cluster regression record (`<prefix>/<cluster>/regression`), as
/// Consul holds it (`None`: absent).
async fn regression_record(consul: &consul_testserver::TestConsul) -> Option<serde_json::Value> {
    let url = format!("http://{}/v1/kv/idgen/test/regression?raw", consul.addr());
    let r = reqwest::get(url).await.expect("read the record");
    if r.status().as_u16() == 404 {
        return None;
    }
    let text = r.text().await.expect("record text");
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// Config files of nodes "a" and "b": segment and strict, quick renewals.
fn two_configs(consul: &TestConsul, dir: &Path) -> Vec<PathBuf> {
    let mut configs = Vec::new();
    for name in ["a", "b"] {
        let path = write_cluster_config(
            dir,
            name,
            consul.addr(),
            &[
                ("segment", "enabled", "true"),
                ("segment", "auto_create", "true"),
                ("segment", "default_step", "10"),
                ("segment", "max_step", "10"),
                ("strict", "enabled", "true"),
                ("hwm", "renew_interval", "\"200ms\""),
                ("admin", "token", &format!("\"{TOKEN}\"")),
            ],
        );
        configs.push(path);
    }
    configs
}

/// Both nodes resume (within a renewal) and nothing repeats.
async fn both_resume(nodes: [&Started; 2], seen: &mut Seen) {
    let issue = |node: &Started, mode: Mode, key: &'static str| {
        let issuer = Arc::clone(&node.issuer);
        async move { issuer.gen_ids(mode, key, 5).await }
    };
    // Both resume (within a renewal) and nothing repeats.
    for node in nodes {
        let mut resumed = None;
        for _ in 0..100 {
            let segment = issue(node, Mode::Segment, TAG).await;
            let strict = issue(node, Mode::Strict, STRICT_KEY).await;
            match (segment, strict) {
                (Ok(ids), Ok(values)) => {
                    seen.numbers("segment", ids);
                    seen.strict_values(values);
                    resumed = None;
                    break;
                }
                (s, t) => {
                    let why = format!(
                        "segment: {:?}; strict: {:?}",
                        s.as_ref().err().map(|e| e.to_string()),
                        t.as_ref().err().map(|e| e.to_string())
                    );
                    if let Ok(ids) = s {
                        seen.numbers("segment", ids);
                    }
                    if let Ok(values) = t {
                        seen.strict_values(values);
                    }
                    resumed = Some(why);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(resumed.is_none(), "a node did not resume: {resumed:?}");
    }
}

/// A node restarted after the restore remembers nothing it wrote, so it
/// cannot detect the rollback itself: the record written by the node that
/// did stops it too, until the skip-ahead deletes the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_after_the_restore_is_stopped_by_the_cluster_record_until_a_skip_ahead() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let configs = two_configs(&consul, dir.path());

    let load = |path: &std::path::Path| {
        Config::load(Some(path), &Overrides::default(), SystemClock.now_millis())
            .expect("cluster config")
    };
    let mut a = start(load(&configs[0])).await;
    let b = start(load(&configs[1])).await;
    let mut seen = Seen::default();
    let issue = |node: &Started, mode: Mode, key: &'static str| {
        let issuer = Arc::clone(&node.issuer);
        async move { issuer.gen_ids(mode, key, 5).await }
    };
    for node in [&a, &b] {
        seen.numbers(
            "segment",
            issue(node, Mode::Segment, TAG).await.expect("segment"),
        );
        seen.strict_values(issue(node, Mode::Strict, STRICT_KEY).await.expect("strict"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let archive = snapshot(&consul).await;
    // Both take several ranges and strict values after the snapshot.
    for _ in 0..6 {
        for node in [&a, &b] {
            seen.numbers(
                "segment",
                issue(node, Mode::Segment, TAG).await.expect("segment"),
            );
            seen.strict_values(issue(node, Mode::Strict, STRICT_KEY).await.expect("strict"));
        }
    }
    restore(&consul, archive).await;

    // B detects (its strict key reads below its own write), and the record
    // appears within a few renewals.
    let mut record = None;
    for _ in 0..100 {
        if let Ok(ids) = issue(&b, Mode::Segment, TAG).await {
            seen.numbers("segment", ids);
        }
        if let Ok(values) = issue(&b, Mode::Strict, STRICT_KEY).await {
            seen.strict_values(values);
        }
        record = regression_record(&consul).await;
        if record.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let record = record.expect("no node wrote the regression record");
    assert!(
        record["key"]
            .as_str()
            .is_some_and(|k| k.starts_with("idgen/test/"))
            && record["node"].is_string()
            && record["at_ms"].as_u64().is_some_and(|t| t > 0),
        "{record}"
    );

    // A restarts: a new node with nothing written to compare with.
    a.stop_within(Duration::from_secs(20)).await;
    a = start(load(&configs[0])).await;
    for (mode, key) in [(Mode::Segment, TAG), (Mode::Strict, STRICT_KEY)] {
        match issue(&a, mode, key).await {
            Ok(ids) => {
                if mode == Mode::Segment {
                    seen.numbers("segment", ids.clone());
                }
                panic!("restarted A issued {mode:?} {ids:?} under the record")
            }
            Err(e) => {
                let text = e.to_string();
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{text}");
                assert!(
                    text.contains("idgen/test/regression")
                        && text.contains(record["key"].as_str().unwrap_or("?"))
                        && text.contains("idgen admin skip-ahead --margin"),
                    "{text}"
                );
            }
        }
    }

    skip_ahead_cli(&b).await;
    assert!(regression_record(&consul).await.is_none(), "record kept");

    both_resume([&a, &b], &mut seen).await;

    for _ in 0..5 {
        for node in [&a, &b] {
            seen.numbers(
                "segment",
                issue(node, Mode::Segment, TAG).await.expect("segment"),
            );
            seen.strict_values(issue(node, Mode::Strict, STRICT_KEY).await.expect("strict"));
        }
    }

    for node in [a, b] {
        node.stop_within(Duration::from_secs(20)).await;
    }
}
