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
    skip_ahead_by(node, "1000").await
}

/// `idgen admin skip-ahead --margin <margin> --json` against `node`.
async fn skip_ahead_by(node: &Started, margin: &'static str) -> String {
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
            margin,
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
    // repeat (Seen asserts it on every call). A node whose own mark came
    // back below its write is fenced at first (snowflake's rule), so
    // every mode is called until each has been refused naming its key.
    let keys = [
        ("segment", format!("segments/{TAG}")),
        ("strict", format!("strict/{STRICT_KEY}")),
        ("lease", "lease/0/".to_owned()),
        ("formatted", format!("formats/{FORMAT}")),
    ];
    let named = |seen: &Seen, mode: &str, key: &str| {
        seen.errors.iter().any(|(m, kind, text)| {
            *m == mode
                && *kind == ErrorKind::Unavailable
                && text.contains(key)
                && text.contains("idgen admin skip-ahead")
        })
    };
    for _ in 0..40 {
        for node in &nodes {
            seen.round(node, 5).await;
        }
        if keys.iter().all(|(mode, key)| named(&seen, mode, key)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (mode, key) in &keys {
        assert!(
            named(&seen, mode, key),
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

/// Lease on, marks written every 10 s: a node's last mark write comes
/// before the save, and the restore leaves its mark as the node knows it,
/// so its mark check cannot tell (the issue's restores within a second of
/// the save); only the cluster's index can.
const SLOW_MARKS: [(&str, &str, &str); 4] = [
    ("lease", "enabled", "true"),
    ("hwm", "reserve", "\"30s\""),
    ("hwm", "renew_interval", "\"10s\""),
    ("clock", "max_startup_skew", "\"60s\""),
];

/// Nodes "a" and "b" with every counter mode and the formatted format,
/// quick renewals, the admin token.
async fn start_pair(consul: &TestConsul, dir: &Path) -> Vec<Started> {
    start_pair_with(consul, dir, &[("lease", "enabled", "true")]).await
}

/// [`start_pair`] with `extra` settings (lease off unless they turn it
/// on: a node with lease mode does not start under a regression record).
async fn start_pair_with(
    consul: &TestConsul,
    dir: &Path,
    extra: &[(&str, &str, &str)],
) -> Vec<Started> {
    let mut nodes = Vec::new();
    for name in ["a", "b"] {
        let admin = format!("\"{TOKEN}\"");
        let mut settings = vec![
            ("segment", "enabled", "true"),
            ("segment", "auto_create", "true"),
            ("segment", "default_step", "100"),
            ("segment", "max_step", "100"),
            ("lease", "block", "100"),
            ("strict", "enabled", "true"),
            ("formatted", "block", "20"),
            ("hwm", "renew_interval", "\"200ms\""),
            ("admin", "token", admin.as_str()),
        ];
        settings.extend_from_slice(extra);
        let path = write_cluster_config(dir, name, consul.addr(), &settings);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(FORMATS);
        std::fs::write(&path, text).unwrap();
        let config = Config::load(Some(&path), &Overrides::default(), SystemClock.now_millis())
            .expect("cluster config");
        nodes.push(start(config).await);
    }
    nodes
}

/// The issue's minimal case: node A issues strict values of a key after
/// the snapshot, the restore puts the key back, and node B, which never
/// wrote the key (nothing of its own to compare with), reads it for the
/// first time. B's read of the key looks current; the cluster's index,
/// below what B saw before the restore, says otherwise. Without the
/// index check B hands out 1001..2000 again (A's values); the same for a
/// segment tag and a formatted counter only A moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_wrote_a_key_does_not_reissue_it_after_a_quick_restore() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_pair_with(&consul, dir.path(), &SLOW_MARKS).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let mut seen = Seen::default();
    let key = STRICT_KEY;
    seen.strict_values(a.issuer.gen_ids(Mode::Strict, key, 1000).await.expect("a"));
    seen.numbers(
        "segment",
        a.issuer.gen_ids(Mode::Segment, TAG, 100).await.expect("a"),
    );
    let out = a.issuer.gen_formatted(FORMAT, &[], 20).await.expect("a");
    seen.formatted.extend(out.ids.into_iter().map(|id| id.text));
    let archive = snapshot(&consul).await;
    // 4,000 more on A, a segment range and a formatted block past the
    // snapshot; then the restore, 0.2 s after the save.
    for _ in 0..4 {
        seen.strict_values(a.issuer.gen_ids(Mode::Strict, key, 1000).await.expect("a"));
    }
    for _ in 0..3 {
        seen.numbers(
            "segment",
            a.issuer.gen_ids(Mode::Segment, TAG, 100).await.expect("a"),
        );
        let out = a.issuer.gen_formatted(FORMAT, &[], 20).await.expect("a");
        for id in out.ids {
            assert!(seen.formatted.insert(id.text.clone()), "{}", id.text);
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    restore(&consul, archive).await;

    // B: every mode refused, nothing repeated (Seen asserts it).
    let strict = b.issuer.gen_ids(Mode::Strict, key, 1000).await;
    let segment = b.issuer.gen_ids(Mode::Segment, TAG, 100).await;
    let formatted = b.issuer.gen_formatted(FORMAT, &[], 20).await;
    if let Ok(v) = &strict {
        seen.strict_values(v.clone());
    }
    if let Ok(ids) = &segment {
        seen.numbers("segment", ids.clone());
    }
    if let Ok(out) = &formatted {
        for id in &out.ids {
            assert!(seen.formatted.insert(id.text.clone()), "{}", id.text);
        }
    }
    for (mode, e) in [
        ("strict", strict.err()),
        ("segment", segment.err()),
        ("formatted", formatted.err()),
    ] {
        let e = e.unwrap_or_else(|| panic!("B issued {mode} after the restore"));
        let text = e.to_string();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{mode}: {text}");
        assert!(
            text.contains("idgen admin skip-ahead --margin"),
            "{mode}: {text}"
        );
    }
    let record = regression_record(&consul)
        .await
        .expect("the cluster record");
    assert!(record["node"].is_string(), "{record}");

    // The skip-ahead moves everything on (by more than the 4,000 values
    // issued since the snapshot): both resume above it all.
    skip_ahead_by(b, "10000").await;
    both_resume([a, b], &mut seen).await;
    for node in nodes {
        node.stop_within(Duration::from_secs(20)).await;
    }
}

/// A regression record in Consul stops every counter write of every node,
/// including a strict batch planned from the node's cached write (no read)
/// and a segment range planned from its cached record: each txn checks
/// that the record does not exist. Before, such cached plans went on
/// issuing for seconds while formatted calls were already refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_regression_record_stops_writes_planned_from_a_cache() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_pair(&consul, dir.path()).await;
    let a = &nodes[0];
    let mut seen = Seen::default();
    // Warm the caches: the strict key's last write, the segment record.
    for _ in 0..3 {
        seen.strict_values(
            a.issuer
                .gen_ids(Mode::Strict, STRICT_KEY, 5)
                .await
                .expect("a"),
        );
        seen.numbers(
            "segment",
            a.issuer.gen_ids(Mode::Segment, TAG, 100).await.expect("a"),
        );
    }
    let record = serde_json::json!({
        "node": "9/9", "key": "idgen/test/strict/elsewhere", "stored": "1",
        "wrote": "2", "at_ms": 1
    });
    let put = reqwest::Client::new()
        .put(format!(
            "http://{}/v1/kv/idgen/test/regression",
            consul.addr()
        ))
        .body(record.to_string())
        .send()
        .await
        .expect("write the record");
    assert_eq!(put.status().as_u16(), 200);
    // The very next strict call (a cached plan) and the next range take
    // are refused.
    let strict = a.issuer.gen_ids(Mode::Strict, STRICT_KEY, 5).await;
    let e = strict.expect_err("a strict call planned from the cache issued");
    assert!(e.to_string().contains("idgen/test/regression"), "{e}");
    let mut refusal = None;
    for _ in 0..3 {
        match a.issuer.gen_ids(Mode::Segment, TAG, 100).await {
            Ok(ids) => seen.numbers("segment", ids),
            Err(e) => {
                refusal = Some(e.to_string());
                break;
            }
        }
    }
    let text = refusal.expect("segment ranges were taken under the record");
    assert!(text.contains("idgen/test/regression"), "{text}");
    for node in nodes {
        node.stop_within(Duration::from_secs(20)).await;
    }
}

/// Unix ms now.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the load of [`load`] handed out, per mode.
#[derive(Default)]
struct Tally {
    segment: HashSet<u64>,
    lease: HashSet<u64>,
    strict: HashSet<u64>,
    formatted: HashSet<String>,
    repeats: usize,
    issued: usize,
}

impl Tally {
    fn add<T: std::hash::Hash + Eq>(set: &mut HashSet<T>, repeats: &mut usize, v: T) {
        if !set.insert(v) {
            *repeats += 1;
        }
    }
}

/// Every node issues every mode in a loop until `stop`.
fn load(
    nodes: &[Started],
    tally: &Arc<std::sync::Mutex<Tally>>,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for node in nodes {
        // `None`: the formatted format.
        for mode in [
            Some(Mode::Segment),
            Some(Mode::Lease),
            Some(Mode::Strict),
            None,
        ] {
            let (issuer, tally, stop) = (
                Arc::clone(&node.issuer),
                Arc::clone(tally),
                Arc::clone(stop),
            );
            tasks.push(tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let ok = if let Some(mode) = mode {
                        let tag = match mode {
                            Mode::Segment => TAG,
                            Mode::Strict => STRICT_KEY,
                            _ => "",
                        };
                        issuer.gen_ids(mode, tag, 50).await.map(|ids| {
                            let mut t = tally.lock().unwrap();
                            let t = &mut *t;
                            for id in ids {
                                let set = match mode {
                                    Mode::Segment => &mut t.segment,
                                    Mode::Lease => &mut t.lease,
                                    _ => &mut t.strict,
                                };
                                Tally::add(set, &mut t.repeats, id);
                                t.issued += 1;
                            }
                        })
                    } else {
                        issuer.gen_formatted(FORMAT, &[], 20).await.map(|out| {
                            let mut t = tally.lock().unwrap();
                            let t = &mut *t;
                            for id in out.ids {
                                Tally::add(&mut t.formatted, &mut t.repeats, id.text);
                                t.issued += 1;
                            }
                        })
                    };
                    if ok.is_err() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }));
        }
    }
    tasks
}

/// A snapshot restored δ after its save while two nodes issue every
/// counter mode flat out: for δ from 0.1 s up, nothing repeats, and the
/// restore is recorded (so every node stops until the skip-ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restored_soon_after_its_save_under_load_repeats_nothing() {
    for delta_ms in [100u64, 300, 800] {
        let consul = common::test_consul().await;
        let dir = tempfile::tempdir().unwrap();
        let nodes = start_pair_with(&consul, dir.path(), &SLOW_MARKS).await;
        let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = load(&nodes, &tally, &stop);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let archive = snapshot(&consul).await;
        let at_save = tally.lock().unwrap().issued;
        tokio::time::sleep(Duration::from_millis(delta_ms)).await;
        let restored_ms = now_ms();
        restore(&consul, archive).await;
        let at_restore = tally.lock().unwrap().issued;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in tasks {
            t.await.expect("load task");
        }
        let (repeats, issued) = {
            let t = tally.lock().unwrap();
            (t.repeats, t.issued)
        };
        assert_eq!(
            repeats, 0,
            "δ {delta_ms} ms: {repeats} repeats in {issued} IDs"
        );
        assert!(
            at_restore > at_save && at_save > 0,
            "δ {delta_ms} ms: nothing issued around the snapshot ({at_save}, {at_restore})"
        );
        let record = regression_record(&consul).await;
        let at_ms = record.as_ref().and_then(|r| r["at_ms"].as_u64());
        assert!(
            at_ms.is_some_and(|t| t >= restored_ms),
            "δ {delta_ms} ms: the restore was not recorded after it happened: {record:?}"
        );
        eprintln!(
            "δ {delta_ms} ms: {issued} IDs ({} between save and restore), 0 repeats, recorded {} ms after the restore began",
            at_restore - at_save,
            at_ms.unwrap_or(0).saturating_sub(restored_ms)
        );
        for node in nodes {
            node.stop_within(Duration::from_secs(20)).await;
        }
    }
}

/// A node stopped before the save and started again after the restore
/// saw nothing of what came after the snapshot, so it cannot tell by
/// itself; the node that kept running detects the restore at its next
/// pulse and records it, and the restarted node is refused by the record.
/// And a node restarted with its saved index onto state older than it
/// (both stopped across the restore) detects by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_restarted_across_a_restore_do_not_reissue() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = start_pair_with(&consul, dir.path(), &[]).await;
    let mut seen = Seen::default();
    seen.strict_values(
        nodes[1]
            .issuer
            .gen_ids(Mode::Strict, STRICT_KEY, 10)
            .await
            .expect("b"),
    );
    let b = nodes.pop().expect("b");
    b.stop_within(Duration::from_secs(20)).await;
    let archive = snapshot(&consul).await;
    for _ in 0..5 {
        seen.strict_values(
            nodes[0]
                .issuer
                .gen_ids(Mode::Strict, STRICT_KEY, 100)
                .await
                .expect("a"),
        );
    }
    // A stops too, after a pulse saved what it saw.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = nodes.pop().expect("a");
    a.stop_within(Duration::from_secs(20)).await;
    restore(&consul, archive).await;
    // A starts first: its saved index is above the restored one.
    let config = |name: &str| {
        Config::load(
            Some(&dir.path().join(format!("{name}.toml"))),
            &Overrides::default(),
            SystemClock.now_millis(),
        )
        .expect("config")
    };
    let a = start(config("a")).await;
    let b = start(config("b")).await;
    for node in [&a, &b] {
        match node.issuer.gen_ids(Mode::Strict, STRICT_KEY, 100).await {
            Ok(v) => seen.strict_values(v),
            Err(e) => assert!(e.to_string().contains("idgen admin skip-ahead"), "{e}"),
        }
    }
    assert!(
        regression_record(&consul).await.is_some(),
        "the restarted node did not record the restore"
    );
    for node in [a, b] {
        node.stop_within(Duration::from_secs(20)).await;
    }
}
