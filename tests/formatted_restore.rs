//! Formatted counters through a lost state file, with the real binary:
//! IDs issued, `idgen state backup` from the running node, more IDs,
//! kill -9, the file removed, `idgen state restore` (refused without
//! margins, then with each format's own margin as the operator states
//! it), a restart. Nothing issued before is issued again, and no
//! counter is pushed into exhaustion by a margin sized for another mode
//! (segment's step): narrow, never-resetting and new formats and new scope
//! values keep issuing, and a format too narrow for its margin is named.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{run_idgen, ChildServer};
use idgen::proto::admin_client::AdminClient;
use idgen::proto::id_gen_client::IdGenClient;
use idgen::proto::{CreateFormatRequest, GenFormattedRequest};

const TOKEN: &str = "formatted-restore-token";

const FORMATS: &str = r#"
[formatted]
block = 100

[[formats]]
name = "inv"
template = "INV{seq:10}"

[[formats]]
name = "daily"
template = "D{yyyy}{MM}{dd}{seq:6}"
reset = "day"

[[formats]]
name = "shops"
template = "S{param:shop:3:digits}{seq:6}"
scope_params = ["shop"]

[[formats]]
name = "tiny"
template = "T{seq:2}"
"#;

fn write_config(dir: &Path, segment: bool) -> PathBuf {
    let path = dir.join("idgen.toml");
    let segment = if segment {
        "[segment]\nenabled = true\nauto_create = true\ndefault_step = 1000\nmax_step = 1000000\n"
    } else {
        ""
    };
    let text = format!(
        "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [store]\npath = \"{}\"\n{segment}\
         [admin]\ntoken = \"{TOKEN}\"\n\
         [log]\nformat = \"json\"\nlevel = \"info\"\n{FORMATS}",
        dir.join("state.redb").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `idgen <args>` off the async runtime.
async fn idgen(args: &[&str]) -> (bool, String) {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_idgen(&args)
    })
    .await
    .unwrap()
}

async fn try_gen(
    c: &mut IdGenClient<tonic::transport::Channel>,
    format: &str,
    params: &[(&str, &str)],
    count: u32,
) -> Result<Vec<String>, tonic::Status> {
    let params = params
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let r = c
        .gen_formatted(GenFormattedRequest {
            format: format.into(),
            params,
            count,
        })
        .await?;
    Ok(r.into_inner().ids)
}

/// `total` IDs of `format` in calls of 1,000, 50 ms apart (so the node's
/// rate sampling sees a steady rate); each added to `seen`, none twice.
async fn paced(node: &ChildServer, format: &str, total: u32, seen: &mut HashSet<String>) {
    let mut c = node.client().await;
    for _ in 0..total / 1000 {
        for id in try_gen(&mut c, format, &[], 1000).await.unwrap() {
            assert!(seen.insert(id.clone()), "{id} handed out twice");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `CreateFormat` with the admin token; `fresh` asserts the name is new.
async fn create_format(node: &ChildServer, json: &str, fresh: bool) -> Result<(), tonic::Status> {
    let mut admin = AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .unwrap();
    let mut req = tonic::Request::new(CreateFormatRequest {
        definition_json: json.into(),
        fresh,
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    admin.create_format(req).await.map(|_| ())
}

/// Takes a backup through the running node.
async fn backup(node: &ChildServer, file: &Path) {
    let addr = format!("http://{}", node.grpc);
    let (ok, out) = idgen(&[
        "state",
        "backup",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        file.to_str().unwrap(),
    ])
    .await;
    assert!(ok, "{out}");
}

/// `idgen state restore` as an operator runs it: first without margins
/// (refused: a backup cannot know what was issued after it, so the tool
/// names the margins to state and proposes none), then with the margins
/// the operator states from what they know the node issued after the
/// backup. Returns the restore's output.
async fn restore_with_stated_margins(config: &Path, file: &Path, margins: &[&str]) -> String {
    let (cfg, file) = (config.to_str().unwrap(), file.to_str().unwrap());
    let (ok, out) = idgen(&["state", "restore", file, "--config", cfg]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("cannot know") && out.contains("--format-skip-ahead NAME=N for format(s)"),
        "{out}"
    );
    assert!(out.contains("format inv: "), "what it knows of inv: {out}");
    assert!(!out.contains("suggested"), "no margin proposed: {out}");
    let mut a = vec!["state", "restore", file, "--config", cfg];
    a.extend_from_slice(margins);
    let (ok, out) = idgen(&a).await;
    assert!(ok, "{out}");
    eprintln!("restore {margins:?} said:\n{out}");
    out
}

/// Case 2 as reported: `INV{seq:10}`, 30,000 IDs, a backup, 20,000 more,
/// kill -9, the state file lost, a restore with the format's own stated
/// margin (the 20,000 issued after the backup, and two blocks): the next
/// 5,000 IDs repeat none of the 50,000 (with segment's margin alone,
/// 1,000, every one of them was a repeat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_the_formats_own_margin_repeats_no_formatted_id() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), false);
    let file = dir.path().join("inv.snapshot");
    let cfg = config.to_str().unwrap();
    let (ok, out) = idgen(&["init", "--config", cfg]).await;
    assert!(ok, "{out}");
    let mut seen = HashSet::new();

    let node = ChildServer::start(&config);
    paced(&node, "inv", 30_000, &mut seen).await;
    backup(&node, &file).await;
    paced(&node, "inv", 20_000, &mut seen).await;
    node.kill();
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();

    // inv issued 20,000 after the backup; the other formats, nothing.
    let margins = [
        "--skip-ahead",
        "1000",
        "--format-skip-ahead",
        "inv=33000",
        "--format-skip-ahead",
        "100",
    ];
    let out = restore_with_stated_margins(&config, &file, &margins).await;
    assert!(
        out.contains("format inv: 1 counters moved forward by 33000"),
        "{out}"
    );
    let node = ChildServer::start(&config);
    let mut c = node.client().await;
    let mut repeats = 0;
    for _ in 0..5 {
        for id in try_gen(&mut c, "inv", &[], 1000).await.unwrap() {
            if !seen.insert(id) {
                repeats += 1;
            }
        }
    }
    assert_eq!(repeats, 0, "IDs of the 50,000 handed out again");
    assert!(node.terminate().success());
}

/// With segment on, `--skip-ahead` is sized for segment ranges (two of
/// `segment.max_step` = 2,000,000): formatted counters move by their own
/// margins instead, so a `{seq:6}` format, a never-resetting one, a scope
/// value used only after the backup, a new scope value and a format created
/// after the restore all still issue, repeating nothing; `T{seq:2}`, too
/// narrow for any margin, is named at restore with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_segment_on_narrow_and_new_formatted_counters_keep_issuing() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), true);
    let file = dir.path().join("all.snapshot");
    let (ok, out) = idgen(&["init", "--config", config.to_str().unwrap()]).await;
    assert!(ok, "{out}");
    let mut seen = HashSet::new();
    let mut take = |ids: Vec<String>| {
        for id in ids {
            assert!(seen.insert(id.clone()), "{id} handed out twice");
        }
    };

    let node = ChildServer::start(&config);
    let mut c = node.client().await;
    for _ in 0..3 {
        take(try_gen(&mut c, "daily", &[], 500).await.unwrap());
        take(try_gen(&mut c, "inv", &[], 500).await.unwrap());
        take(
            try_gen(&mut c, "shops", &[("shop", "001")], 300)
                .await
                .unwrap(),
        );
        take(try_gen(&mut c, "tiny", &[], 10).await.unwrap());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    backup(&node, &file).await;
    take(try_gen(&mut c, "daily", &[], 500).await.unwrap());
    take(try_gen(&mut c, "inv", &[], 500).await.unwrap());
    take(
        try_gen(&mut c, "shops", &[("shop", "001")], 300)
            .await
            .unwrap(),
    );
    // A scope value first used after the backup: its counter is not in it.
    take(
        try_gen(&mut c, "shops", &[("shop", "002")], 150)
            .await
            .unwrap(),
    );
    node.kill();
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();

    // Segment's margin covers ranges of up to 1,000,000; every format's,
    // the 500 or fewer values each issued after the backup.
    let margins = ["--skip-ahead", "2000000", "--format-skip-ahead", "1000"];
    let out = restore_with_stated_margins(&config, &file, &margins).await;
    assert!(
        out.contains("warning: format tiny:") && out.contains("new format"),
        "the narrow format is named with what to do: {out}"
    );
    let node = ChildServer::start(&config);
    let mut c = node.client().await;
    take(try_gen(&mut c, "daily", &[], 500).await.unwrap());
    take(try_gen(&mut c, "inv", &[], 500).await.unwrap());
    take(
        try_gen(&mut c, "shops", &[("shop", "001")], 300)
            .await
            .unwrap(),
    );
    take(
        try_gen(&mut c, "shops", &[("shop", "002")], 300)
            .await
            .unwrap(),
    );
    take(
        try_gen(&mut c, "shops", &[("shop", "003")], 300)
            .await
            .unwrap(),
    );
    let tiny = try_gen(&mut c, "tiny", &[], 1).await.unwrap_err();
    assert_eq!(tiny.code(), tonic::Code::ResourceExhausted, "{tiny:?}");

    // A format created after the restore, asserted new, starts at its
    // minimum.
    create_format(&node, r#"{"name":"fresh","template":"F{seq:6}"}"#, true)
        .await
        .unwrap();
    let fresh = try_gen(&mut c, "fresh", &[], 3).await.unwrap();
    assert_eq!(fresh, ["F000000", "F000001", "F000002"]);
    assert!(node.terminate().success());
}

/// A format created after the backup and used, lost with the state file,
/// then created again after the restore with the same definition (the
/// operator's apps need it) starts above what the lost node handed out. A
/// never-resetting format too narrow for the restore's margin is refused
/// with FAILED_PRECONDITION naming the restore and the way out; created
/// `fresh` (the operator's assertion) it starts at its minimum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_created_again_after_a_restore_repeats_nothing() {
    const LATE: &str = r#"{"name":"late","template":"L{seq:8}"}"#;
    const SMALL: &str = r#"{"name":"small","template":"S{seq:2}"}"#;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), false);
    let file = dir.path().join("late.snapshot");
    let (ok, out) = idgen(&["init", "--config", config.to_str().unwrap()]).await;
    assert!(ok, "{out}");

    let node = ChildServer::start(&config);
    backup(&node, &file).await;
    create_format(&node, LATE, false).await.unwrap();
    create_format(&node, SMALL, false).await.unwrap();
    let mut c = node.client().await;
    let mut before = HashSet::new();
    for _ in 0..2 {
        before.extend(try_gen(&mut c, "late", &[], 50).await.unwrap());
    }
    before.extend(try_gen(&mut c, "small", &[], 5).await.unwrap());
    assert_eq!(before.len(), 105);
    node.kill();
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();

    // The operator knows formats were created after the backup: a bare N
    // is their margin too.
    let margins = ["--skip-ahead", "1000", "--format-skip-ahead", "1000"];
    let out = restore_with_stated_margins(&config, &file, &margins).await;
    assert!(out.contains("--fresh"), "{out}");
    let node = ChildServer::start(&config);
    create_format(&node, LATE, false).await.unwrap();
    let mut c = node.client().await;
    for _ in 0..3 {
        for id in try_gen(&mut c, "late", &[], 100).await.unwrap() {
            assert!(!before.contains(&id), "{id} handed out again");
        }
    }

    let refused = create_format(&node, SMALL, false).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    let msg = refused.message();
    assert!(
        msg.contains("restored from a backup") && msg.contains("--fresh") && msg.contains("0..=99"),
        "{msg}"
    );
    let unknown = try_gen(&mut c, "small", &[], 1).await.unwrap_err();
    assert_eq!(
        unknown.code(),
        tonic::Code::NotFound,
        "nothing stored: {unknown:?}"
    );
    create_format(&node, SMALL, true).await.unwrap();
    assert_eq!(
        try_gen(&mut c, "small", &[], 2).await.unwrap(),
        ["S00", "S01"]
    );
    assert!(node.terminate().success());
}
