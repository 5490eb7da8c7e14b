//! Backup and recovery of the embedded state file with the real binary:
//! a snapshot taken while gRPC callers are in flight, then kill -9, the
//! file deleted, `idgen state restore --skip-ahead` with the suggested
//! margin, and a restart: nothing handed out before (snowflake, segment,
//! lease, strict) is handed out again. And every way restore refuses.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{call_until_stopped, run_idgen, ChildServer};
use idgen::proto::{GenIdsRequest, Mode};

const TOKEN: &str = "backup-test-token";

const MODES: [(Mode, &str); 4] = [
    (Mode::Snowflake, ""),
    (Mode::Segment, "orders"),
    (Mode::Lease, ""),
    (Mode::Strict, "chat/room1"),
];

fn write_config(dir: &Path, preset: &str) -> PathBuf {
    let path = dir.join(format!("idgen-{preset}.toml"));
    let text = format!(
        "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [store]\npath = \"{}\"\n\
         [layout]\npreset = \"{preset}\"\n\
         [segment]\nenabled = true\nauto_create = true\ndefault_step = 100\nmax_step = 5000\n\
         [lease]\nenabled = true\nblock = 200\n\
         [strict]\nenabled = true\n\
         [admin]\ntoken = \"{TOKEN}\"\n\
         [log]\nformat = \"json\"\nlevel = \"info\"\n",
        dir.join("state.redb").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn request(mode: Mode, tag: &str) -> GenIdsRequest {
    GenIdsRequest {
        mode: mode as i32,
        tag: tag.into(),
        count: 20,
    }
}

/// Runs `idgen <args>` off the async runtime.
async fn idgen(args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_idgen(&args)
    })
    .await
    .unwrap()
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// Callers in flight on every mode until `stop`; IDs per mode.
async fn load(
    server: &ChildServer,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<u64>>> {
    let mut tasks = Vec::new();
    for (mode, tag) in MODES {
        tasks.push(call_until_stopped(
            server.client().await,
            request(mode, tag),
            Arc::clone(stop),
        ));
    }
    tasks
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Vec<u64>>>) -> Vec<Vec<u64>> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The margin `idgen state restore` suggests when --skip-ahead is missing.
fn suggested(out: &str) -> u64 {
    let rest = out
        .split("suggested: --skip-ahead ")
        .nth(1)
        .unwrap_or_else(|| panic!("no suggestion in: {out}"));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_under_load_then_restore_with_skip_ahead_never_repeats_an_id() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "twitter");
    let cfg = config.to_str().unwrap().to_owned();
    let state = dir.path().join("state.redb");
    let backup = dir.path().join("backups/state.snapshot");
    let (ok, out) = idgen(args(&["init", "--config", &cfg])).await;
    assert!(ok, "{out}");

    let node = ChildServer::start(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&node, &stop).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A second process cannot open the file the node holds: the offline
    // path refuses and points at the node.
    let (ok, out) = idgen(args(&[
        "state",
        "backup",
        "--offline",
        "--config",
        &cfg,
        backup.to_str().unwrap(),
    ]))
    .await;
    assert!(!ok && out.contains("--addr"), "{out}");
    assert!(!backup.exists());

    // The backup, through the running node, with callers in flight.
    let addr = format!("http://{}", node.grpc);
    let (ok, out) = idgen(args(&[
        "state",
        "backup",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        backup.to_str().unwrap(),
    ]))
    .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("wrote snapshot") && out.contains("issue rate"),
        "{out}"
    );
    // The node keeps issuing after it: these IDs are what the snapshot
    // does not know about.
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.kill();
    stop.store(true, Ordering::SeqCst);
    let before = collect(tasks).await;
    for ((mode, _), ids) in MODES.iter().zip(&before) {
        assert!(
            ids.len() > 100,
            "{mode:?}: only {} IDs before the kill",
            ids.len()
        );
    }

    // An offline backup of the file the crash left behind works too (it
    // is repaired first, as a starting node would).
    let crashed = dir.path().join("backups/after-crash.snapshot");
    let (ok, out) = idgen(args(&[
        "state",
        "backup",
        "--offline",
        "--config",
        &cfg,
        crashed.to_str().unwrap(),
    ]))
    .await;
    assert!(ok && out.contains("not recorded (offline backup)"), "{out}");

    // The file is lost. The node refuses to start, pointing at restore.
    std::fs::remove_file(&state).unwrap();
    let err = ChildServer::try_start(&config, &[]).err().expect("refuses");
    assert!(err.contains("idgen state restore"), "{err}");

    // Restore: without --skip-ahead it refuses and suggests a margin.
    let (ok, out) = idgen(args(&[
        "state",
        "restore",
        backup.to_str().unwrap(),
        "--config",
        &cfg,
    ]))
    .await;
    assert!(!ok, "{out}");
    let margin = suggested(&out);
    assert!(!state.exists());
    let (ok, out) = idgen(args(&[
        "state",
        "restore",
        backup.to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        &margin.to_string(),
    ]))
    .await;
    assert!(ok, "{out}");
    assert!(out.contains("moved forward by"), "{out}");

    // Restart on the restored file, under load again.
    let node = ChildServer::start(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&node, &stop).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let after = collect(tasks).await;
    assert!(node.terminate().success());

    let counts: Vec<(usize, usize)> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (b.len(), a.len()))
        .collect();
    eprintln!("margin {margin}; IDs (before, after) per mode {MODES:?}: {counts:?}");
    // Every mode checked before failing, so a failure names each mode
    // that repeated.
    let mut repeats = Vec::new();
    for (((mode, _), old), new) in MODES.iter().zip(&before).zip(&after) {
        assert!(!new.is_empty(), "{mode:?} issues after the restore");
        let mut seen = HashSet::new();
        let twice: Vec<u64> = old
            .iter()
            .chain(new)
            .filter(|id| !seen.insert(**id))
            .copied()
            .collect();
        if !twice.is_empty() {
            repeats.push(format!(
                "{mode:?}: {} IDs handed out twice, e.g. {}",
                twice.len(),
                twice[0]
            ));
        }
    }
    assert!(
        repeats.is_empty(),
        "repeats across the restore (margin {margin}): {repeats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_what_could_repeat_ids() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "twitter");
    let cfg = config.to_str().unwrap().to_owned();
    let state = dir.path().join("state.redb");
    let backup = dir.path().join("state.snapshot");
    let (ok, out) = idgen(args(&["init", "--config", &cfg])).await;
    assert!(ok, "{out}");
    // An offline backup of a stopped node's file.
    let (ok, out) = idgen(args(&[
        "state",
        "backup",
        "--offline",
        "--config",
        &cfg,
        backup.to_str().unwrap(),
    ]))
    .await;
    assert!(ok, "{out}");
    assert!(out.contains("not recorded (offline backup)"), "{out}");
    // Never overwrites a backup.
    let (ok, out) = idgen(args(&[
        "state",
        "backup",
        "--offline",
        "--config",
        &cfg,
        backup.to_str().unwrap(),
    ]))
    .await;
    assert!(!ok && out.contains("refusing to overwrite"), "{out}");

    // Refuses to overwrite an existing state file.
    let restore = |extra: &[&str]| {
        let mut a = args(&["state", "restore"]);
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        a
    };
    let (ok, out) = idgen(restore(&[
        backup.to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        "1000",
    ]))
    .await;
    assert!(!ok && out.contains("refusing to overwrite"), "{out}");
    std::fs::remove_file(&state).unwrap();

    // Refuses a file that is not a snapshot: garbage, and a state file.
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, b"not a snapshot").unwrap();
    let (ok, out) = idgen(restore(&[
        garbage.to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        "1000",
    ]))
    .await;
    assert!(!ok && out.contains("not an idgen snapshot"), "{out}");
    let other = tempfile::tempdir().unwrap();
    let other_cfg = write_config(other.path(), "twitter");
    let (ok, out) = idgen(args(&["init", "--config", other_cfg.to_str().unwrap()])).await;
    assert!(ok, "{out}");
    let (ok, out) = idgen(restore(&[
        other.path().join("state.redb").to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        "1000",
    ]))
    .await;
    assert!(!ok && out.contains("not an idgen snapshot"), "{out}");

    // Refuses a snapshot of another layout.
    let js53 = write_config(dir.path(), "js53");
    let (ok, out) = idgen(restore(&[
        backup.to_str().unwrap(),
        "--config",
        js53.to_str().unwrap(),
        "--skip-ahead",
        "1000",
    ]))
    .await;
    assert!(!ok && out.contains("layout"), "{out}");

    // Refuses without --skip-ahead, printing a suggestion and why.
    let (ok, out) = idgen(restore(&[backup.to_str().unwrap(), "--config", &cfg])).await;
    assert!(!ok, "{out}");
    assert!(out.contains("--skip-ahead is required"), "{out}");
    assert!(suggested(&out) >= 1000, "{out}");
    assert!(out.contains("offline"), "explains the missing rates: {out}");
    assert!(!state.exists(), "nothing restored by a refusal");

    // Then it restores, once.
    let (ok, out) = idgen(restore(&[
        backup.to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        "5000",
    ]))
    .await;
    assert!(ok, "{out}");
    assert!(state.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".restore-"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary files left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_backup_after_the_file_was_deleted_restores_without_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "twitter");
    let cfg = config.to_str().unwrap().to_owned();
    let state = dir.path().join("state.redb");
    let rescue = dir.path().join("rescue.snapshot");
    let (ok, out) = idgen(args(&["init", "--config", &cfg])).await;
    assert!(ok, "{out}");
    let node = ChildServer::start(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&node, &stop).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Deleted under load: the callers stop at their first refusal.
    std::fs::remove_file(&state).unwrap();
    let before = collect(tasks).await;
    // The node still holds the file it wrote: a rescue snapshot of it.
    let addr = format!("http://{}", node.grpc);
    let (ok, out) = idgen(args(&[
        "state",
        "backup",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        rescue.to_str().unwrap(),
    ]))
    .await;
    assert!(ok && out.contains("rescue snapshot"), "{out}");
    assert!(!node.terminate().success(), "no final mark without a file");
    assert!(!state.exists());

    let (ok, out) = idgen(args(&[
        "state",
        "restore",
        rescue.to_str().unwrap(),
        "--config",
        &cfg,
    ]))
    .await;
    assert!(!ok && out.contains("rescue snapshot"), "{out}");
    let margin = suggested(&out);
    // Rates do not matter for a rescue snapshot: two segment ranges at
    // max_step (2 x 5000), rounded up.
    assert_eq!(margin, 10_000, "{out}");
    let (ok, out) = idgen(args(&[
        "state",
        "restore",
        rescue.to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        &margin.to_string(),
    ]))
    .await;
    assert!(ok, "{out}");

    let node = ChildServer::start(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&node, &stop).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let after = collect(tasks).await;
    assert!(node.terminate().success());
    for (((mode, _), old), new) in MODES.iter().zip(&before).zip(&after) {
        assert!(!old.is_empty() && !new.is_empty(), "{mode:?} issued");
        let mut seen = HashSet::new();
        for id in old.iter().chain(new) {
            assert!(seen.insert(*id), "{mode:?}: {id} handed out twice");
        }
    }
}
