//! The embedded state file's lifecycle: a file deleted (or replaced by a
//! new `idgen init`) under a running node stops it in every mode within
//! one high-water-mark renewal interval, and a second node started on the
//! new file cannot make the first one issue again.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{metric, run_idgen, ChildServer, TestServer};
use idgen::config::Config;
use idgen::proto::id_gen_client::IdGenClient;
use idgen::proto::{GenIdsRequest, Mode};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// One renewal interval: the default `hwm.renew_interval`.
const RENEW_INTERVAL: Duration = Duration::from_secs(1);

const MODES: [(Mode, &str); 4] = [
    (Mode::Snowflake, ""),
    (Mode::Segment, "orders"),
    (Mode::Lease, ""),
    (Mode::Strict, "chat/room1"),
];

fn all_modes(dir: &Path) -> Config {
    let c = common::all_modes_config(dir);
    assert_eq!(c.hwm.renew_interval, RENEW_INTERVAL);
    c
}

fn request(mode: Mode, tag: &str) -> GenIdsRequest {
    GenIdsRequest {
        mode: mode as i32,
        tag: tag.into(),
        count: 10,
    }
}

/// Every mode issues.
async fn all_issue(c: &mut IdGenClient<Channel>) {
    for (mode, tag) in MODES {
        let ids = c
            .gen_ids(request(mode, tag))
            .await
            .unwrap_or_else(|e| panic!("{mode:?} issues: {e}"))
            .into_inner()
            .ids;
        assert_eq!(ids.len(), 10);
    }
}

/// Every mode refuses with UNAVAILABLE naming the path and what happened.
async fn all_refuse(c: &mut IdGenClient<Channel>, path: &Path, what: &str) {
    for (mode, tag) in MODES {
        let e = c
            .gen_ids(request(mode, tag))
            .await
            .expect_err("must refuse once the state file is gone");
        assert_eq!(e.code(), tonic::Code::Unavailable, "{mode:?}: {e:?}");
        let msg = e.message();
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains(what),
            "{mode:?}: names the path and what happened: {msg}"
        );
        assert!(
            msg.contains("idgen state restore") && msg.contains("do not run `idgen init`"),
            "{mode:?}: says what to do: {msg}"
        );
    }
}

async fn readyz(http: std::net::SocketAddr) -> u16 {
    reqwest::get(format!("http://{http}/readyz"))
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_state_file_stops_every_mode_within_one_renewal_interval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let server = TestServer::start(all_modes(dir.path())).await;
    let mut c = server.client().await;
    all_issue(&mut c).await;
    assert!(common::wait_for_status(&server.url("/readyz"), 200).await);

    std::fs::remove_file(&path).unwrap();
    tokio::time::sleep(RENEW_INTERVAL).await;

    all_refuse(&mut c, &path, "deleted").await;
    assert_eq!(readyz(server.http).await, 503);
    assert_eq!(
        common::grpc_health(server.grpc).await,
        ServingStatus::NotServing
    );
    // The JSON API refuses too.
    let r = reqwest::get(server.url("/v1/id?mode=snowflake"))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    // Never recreated, by the node's writes or its checks.
    tokio::time::sleep(RENEW_INTERVAL).await;
    assert!(!path.exists(), "the node must not recreate its state file");
    all_refuse(&mut c, &path, "deleted").await;
    // The node is left running (its final mark cannot be stored).
    drop(server);
}

fn child_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("idgen.toml");
    let text = format!(
        "[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [store]\npath = \"{}\"\n\
         [segment]\nenabled = true\nauto_create = true\ndefault_step = 100\n\
         [lease]\nenabled = true\nblock = 100\n\
         [strict]\nenabled = true\n\
         [log]\nformat = \"json\"\nlevel = \"info\"\n",
        dir.join("state.redb").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_state_file_stops_the_node_and_a_second_node_cannot_revive_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let config = child_config(dir.path());
    let cfg = config.to_str().unwrap();
    let (ok, out) = run_idgen(&["init", "--config", cfg]);
    assert!(ok, "{out}");
    let first = ChildServer::start(&config);
    let mut c1 = first.client().await;
    all_issue(&mut c1).await;

    // The operator's mistake: a fresh state file put in place of the one
    // the node runs on. Made beside it and renamed over it, so the path is
    // never missing: whatever the scheduling, the node sees a replacement,
    // not a deletion (a test that deleted first and ran `init` raced the
    // watch thread on a loaded machine).
    let fresh = dir.path().join("fresh.redb");
    let (ok, out) = run_idgen(&["init", "--config", cfg, "--state", fresh.to_str().unwrap()]);
    assert!(ok, "{out}");
    std::fs::rename(&fresh, &path).unwrap();
    tokio::time::sleep(RENEW_INTERVAL).await;

    all_refuse(&mut c1, &path, "replaced").await;
    assert_eq!(readyz(first.http).await, 503);
    assert_eq!(
        common::grpc_health(first.grpc).await,
        ServingStatus::NotServing
    );
    let text = reqwest::get(format!("http://{}/metrics", first.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(metric(&text, "idgen_state_file_lost"), Some(1.0), "{text}");
    assert!(
        first.log_text().contains("state file lost"),
        "an error is logged: {}",
        first.log_text()
    );

    // A second node on the new file, beside the first: it serves, and the
    // first one stays stopped whatever the second writes.
    let second = ChildServer::start(&config);
    let mut c2 = second.client().await;
    all_issue(&mut c2).await;
    tokio::time::sleep(RENEW_INTERVAL).await;
    all_refuse(&mut c1, &path, "replaced").await;
    assert_eq!(readyz(first.http).await, 503);
    assert_eq!(readyz(second.http).await, 200);
    let text = reqwest::get(format!("http://{}/metrics", second.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(metric(&text, "idgen_state_file_lost"), Some(0.0));
    // The first node's SIGTERM cannot store its final mark: it says so
    // and exits non-zero; the new file is untouched by it.
    let status = first.terminate();
    assert!(!status.success());
    assert!(second.terminate().success());
}

/// docs/OPERATIONS.md, "First start", one node (embedded), as written
/// there: `idgen check-config --config prod.toml` prints the effective
/// settings, `idgen init --config prod.toml` creates the state file once
/// (warning it is EMPTY) and refuses to overwrite it, and `idgen serve
/// --config prod.toml` starts healthy: the log lines, `/readyz` and
/// `idgen_serving` the page names. The config keeps `store.init_if_missing
/// = false`, as the page says to, so a node started before `init` refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_start_runbook_checks_inits_once_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let config = child_config(dir.path());
    let prod = dir.path().join("prod.toml");
    std::fs::rename(&config, &prod).unwrap();
    let cfg = prod.to_str().expect("a UTF-8 temp path");

    let (ok, out) = run_idgen(&["check-config", "--config", cfg]);
    assert!(ok && out.contains("init_if_missing = false"), "{out}");
    let before = ChildServer::try_start(&prod, &[])
        .err()
        .expect("no state file yet: the node refuses");
    assert!(before.contains("idgen init"), "{before}");

    let (ok, out) = run_idgen(&["init", "--config", cfg]);
    assert!(ok && out.contains("creates an EMPTY state file"), "{out}");
    assert!(dir.path().join("state.redb").is_file());
    let (ok, again) = run_idgen(&["init", "--config", cfg]);
    assert!(
        !ok && again.contains("state.redb"),
        "refuses to overwrite: {again}"
    );

    let node = ChildServer::start(&prod);
    for line in [
        "high-water mark reserved; generator starts above every earlier ID",
        "ready",
        "idgen serving",
    ] {
        assert!(
            node.logs_within_10s(line).await,
            "no {line:?}: {}",
            node.log_text()
        );
    }
    assert_eq!(readyz(node.http).await, 200);
    let text = common::metrics_text(&node).await;
    assert_eq!(metric(&text, "idgen_serving"), Some(1.0), "{text}");
    assert_eq!(node.terminate().code(), Some(0));
}
