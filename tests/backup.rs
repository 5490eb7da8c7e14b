//! Backup and recovery of the embedded state file with the real binary:
//! a snapshot taken while gRPC callers are in flight, then kill -9, the
//! file deleted, `idgen state restore` (refused without margins, which
//! the operator states; or from the node's mirror, with none), and a
//! restart: nothing handed out before (snowflake, segment, lease, strict,
//! formatted) is handed out again. And every way restore refuses.

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
    write_config_with(dir, preset, None, "")
}

/// The test config with a state mirror if given, and `extra` TOML
/// appended (formats).
fn write_config_with(dir: &Path, preset: &str, mirror: Option<&Path>, extra: &str) -> PathBuf {
    let path = dir.join(format!("idgen-{preset}.toml"));
    let mirror = mirror.map_or(String::new(), |m| {
        format!("mirror_path = \"{}\"\n", m.display())
    });
    let text = format!(
        "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [store]\npath = \"{}\"\n{mirror}\
         [layout]\npreset = \"{preset}\"\n\
         [segment]\nenabled = true\nauto_create = true\ndefault_step = 100\nmax_step = 5000\n\
         [lease]\nenabled = true\nblock = 200\n\
         [strict]\nenabled = true\n\
         [admin]\ntoken = \"{TOKEN}\"\n\
         [log]\nformat = \"json\"\nlevel = \"info\"\n{extra}",
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

/// A restore from a backup without margins is refused: it says it cannot
/// know what was issued after the backup, names the margins to state, and
/// proposes no number of its own.
fn assert_refused_without_a_guess(out: &str) {
    assert!(
        out.contains("cannot know how much the node handed out after it"),
        "{out}"
    );
    assert!(
        out.contains("--skip-ahead N") && out.contains("--strict-skip-ahead N"),
        "{out}"
    );
    assert!(!out.contains("suggested"), "no margin proposed: {out}");
}

/// The margin an operator states from what they know: every ID the
/// callers got in the whole run (more than were issued after the backup),
/// plus two segment ranges at max_step (a range is handed out in part).
fn stated_margin(before: &[Vec<u64>]) -> u64 {
    before.iter().map(|ids| ids.len() as u64).sum::<u64>() + 2 * 5000
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

    // Restore: without margins it refuses, proposing none.
    let (ok, out) = idgen(args(&[
        "state",
        "restore",
        backup.to_str().unwrap(),
        "--config",
        &cfg,
    ]))
    .await;
    assert!(!ok, "{out}");
    assert_refused_without_a_guess(&out);
    assert!(!state.exists());
    let margin = stated_margin(&before);
    let (ok, out) = idgen(args(&[
        "state",
        "restore",
        backup.to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        &margin.to_string(),
        "--strict-skip-ahead",
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
    assert!(out.contains("nothing here bounds how much"), "{out}");
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
        "--strict-skip-ahead",
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

    // Refuses without the margins, proposing none; says why the rates
    // are missing. One margin alone is not enough: strict has its own.
    let (ok, out) = idgen(restore(&[backup.to_str().unwrap(), "--config", &cfg])).await;
    assert!(!ok, "{out}");
    assert_refused_without_a_guess(&out);
    assert!(out.contains("not recorded (offline backup)"), "{out}");
    let (ok, out) = idgen(restore(&[
        backup.to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        "5000",
    ]))
    .await;
    assert!(!ok && out.contains("--strict-skip-ahead N"), "{out}");
    assert!(!state.exists(), "nothing restored by a refusal");

    // Then it restores, once.
    let (ok, out) = idgen(restore(&[
        backup.to_str().unwrap(),
        "--config",
        &cfg,
        "--skip-ahead",
        "5000",
        "--strict-skip-ahead",
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

    // A rescue snapshot holds everything the node handed out: restored
    // with no margin, exactly.
    let (ok, out) = idgen(args(&[
        "state",
        "restore",
        rescue.to_str().unwrap(),
        "--config",
        &cfg,
    ]))
    .await;
    assert!(ok && out.contains("rescue snapshot"), "{out}");
    assert!(out.contains("no margin (exact: 0)"), "{out}");

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

const INV: &str =
    "[formatted]\nblock = 100\n[[formats]]\nname = \"inv\"\ntemplate = \"INV{seq:10}\"\n";

/// Callers in flight on every mode and on format `inv` until `stop`: IDs
/// per mode (formatted ones as strings).
async fn full_speed(
    node: &ChildServer,
    stop: &Arc<AtomicBool>,
) -> (
    Vec<tokio::task::JoinHandle<Vec<u64>>>,
    tokio::task::JoinHandle<Vec<String>>,
) {
    let tasks = load(node, stop).await;
    let (mut c, stop) = (node.client().await, Arc::clone(stop));
    let formatted = tokio::spawn(async move {
        let mut got = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            match common::formatted_ids(&mut c, "inv", 100).await {
                Ok(ids) => got.extend(ids),
                Err(_) => break,
            }
        }
        got
    });
    (tasks, formatted)
}

/// IDs handed out twice across `old` and `new`, per mode, named.
fn repeats(old: &[Vec<u64>], new: &[Vec<u64>], fold: &[String], fnew: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (((mode, _), old), new) in MODES.iter().zip(old).zip(new) {
        let mut seen = HashSet::new();
        let n = old
            .iter()
            .chain(new)
            .filter(|id| !seen.insert(**id))
            .count();
        if n > 0 {
            out.push(format!("{mode:?}: {n} of {} repeated", new.len()));
        }
    }
    let mut seen = HashSet::new();
    let n = fold
        .iter()
        .chain(fnew)
        .filter(|id| !seen.insert(id.as_str()))
        .count();
    if n > 0 {
        out.push(format!("formatted inv: {n} of {} repeated", fnew.len()));
    }
    out
}

/// Runs `idgen state restore FILE` exactly as the tool prints: first with
/// no margin; if it refuses and prints margins (`--skip-ahead N`, `format
/// NAME: moves by N`), again with exactly those. Returns whether a state
/// file was restored, and the tool's last output.
async fn restore_as_printed(cfg: &str, file: &Path) -> (bool, String) {
    let file = file.to_str().unwrap();
    let (ok, out) = idgen(args(&["state", "restore", file, "--config", cfg])).await;
    if ok {
        return (true, out);
    }
    // The first place the marker is followed by a number, if any.
    let number_after = |text: &str, marker: &str| -> Option<String> {
        text.split(marker).skip(1).find_map(|rest| {
            let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
            (!n.is_empty()).then_some(n)
        })
    };
    let Some(skip) = number_after(&out, "--skip-ahead ") else {
        return (false, out);
    };
    let mut again = args(&[
        "state",
        "restore",
        file,
        "--config",
        cfg,
        "--skip-ahead",
        &skip,
    ]);
    if let Some(n) = number_after(&out, "format inv: moves by ") {
        again.extend(args(&["--format-skip-ahead", &format!("inv={n}")]));
    }
    let (ok, out) = idgen(again).await;
    assert!(ok, "{out}");
    (true, out)
}

/// Issue 32, item 3, as the trial ran it: start, 2 s idle, a backup
/// through the node, then every mode and `INV{seq:10}` at full speed,
/// kill -9, the state file removed, and `idgen state restore` done exactly
/// as the tool prints. The tool used to print `--skip-ahead 3000` and
/// `format inv: moves by 200` from rates measured before the backup, and
/// following them repeated most formatted and lease IDs: this test then
/// fails with the repeats. Now it refuses, proposes no number and says it
/// cannot know; the operator states margins from what they know (every ID
/// of the run), and nothing repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restored_as_the_tool_prints_after_full_speed_issuing_repeats_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config_with(dir.path(), "twitter", None, INV);
    let cfg = config.to_str().unwrap().to_owned();
    let backup = dir.path().join("idle.snapshot");
    let (ok, out) = idgen(args(&["init", "--config", &cfg])).await;
    assert!(ok, "{out}");
    let node = ChildServer::start(&config);
    tokio::time::sleep(Duration::from_secs(2)).await;
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
    let stop = Arc::new(AtomicBool::new(false));
    let (tasks, formatted) = full_speed(&node, &stop).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    node.kill();
    stop.store(true, Ordering::SeqCst);
    let before = collect(tasks).await;
    let fbefore = formatted.await.unwrap();
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();

    let (restored, out) = restore_as_printed(&cfg, &backup).await;
    eprintln!("the tool printed:\n{out}");
    if !restored {
        assert_refused_without_a_guess(&out);
        assert!(
            out.contains("--format-skip-ahead NAME=N for format(s) inv")
                && out.contains("information only"),
            "{out}"
        );
        // The operator states the margins: every ID of the run, which is
        // more than what was issued after the backup.
        let margin = stated_margin(&before).to_string();
        let fmargin = format!("inv={}", fbefore.len() + 2 * 100 * 64);
        let (ok, out) = idgen(args(&[
            "state",
            "restore",
            backup.to_str().unwrap(),
            "--config",
            &cfg,
            "--skip-ahead",
            &margin,
            "--strict-skip-ahead",
            &margin,
            "--format-skip-ahead",
            &fmargin,
        ]))
        .await;
        assert!(ok, "{out}");
    }
    let node = ChildServer::start(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let (tasks, formatted) = full_speed(&node, &stop).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let after = collect(tasks).await;
    let fafter = formatted.await.unwrap();
    assert!(node.terminate().success());
    let counts: Vec<usize> = before.iter().map(Vec::len).collect();
    eprintln!(
        "before the kill: {counts:?} of {MODES:?}, {} formatted",
        fbefore.len()
    );
    assert!(after.iter().all(|ids| !ids.is_empty()) && !fafter.is_empty());
    let twice = repeats(&before, &after, &fbefore, &fafter);
    assert!(twice.is_empty(), "repeats across the restore: {twice:?}");
}

/// The same run with `store.mirror_path`: the mirror is rewritten before
/// every reservation's IDs are handed out, so `idgen state restore
/// MIRROR` needs no margin, says so, and restores exactly: nothing
/// repeats, and a strict key continues right above its last value (at
/// most the one call in flight at the kill skipped), not millions above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_restores_exactly_with_no_margin_after_full_speed_issuing() {
    let dir = tempfile::tempdir().unwrap();
    let mirror = dir.path().join("mirror/state.mirror");
    let config = write_config_with(dir.path(), "twitter", Some(&mirror), INV);
    let cfg = config.to_str().unwrap().to_owned();
    let (ok, out) = idgen(args(&["init", "--config", &cfg])).await;
    assert!(ok, "{out}");
    let node = ChildServer::start(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let (tasks, formatted) = full_speed(&node, &stop).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    node.kill();
    stop.store(true, Ordering::SeqCst);
    let before = collect(tasks).await;
    let fbefore = formatted.await.unwrap();
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();

    let (restored, out) = restore_as_printed(&cfg, &mirror).await;
    assert!(restored, "{out}");
    assert!(
        out.contains("a mirror") && out.contains("no margin (exact: 0)"),
        "{out}"
    );
    let node = ChildServer::start(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let (tasks, formatted) = full_speed(&node, &stop).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let after = collect(tasks).await;
    let fafter = formatted.await.unwrap();
    assert!(node.terminate().success());
    let counts: Vec<usize> = before.iter().map(Vec::len).collect();
    eprintln!(
        "before the kill: {counts:?} of {MODES:?}, {} formatted",
        fbefore.len()
    );
    assert!(before.iter().all(|ids| ids.len() > 100), "{counts:?}");
    let twice = repeats(&before, &after, &fbefore, &fafter);
    assert!(twice.is_empty(), "repeats across the restore: {twice:?}");
    let strict_last = before[3].iter().max().copied().unwrap_or(0);
    let strict_next = after[3].iter().min().copied().unwrap_or(0);
    assert!(
        strict_next > strict_last && strict_next <= strict_last + 20 + 1,
        "strict continues above {strict_last} exactly (one call of 20 may be lost in flight): got {strict_next}"
    );
}
